"""Declare a setting once; parse, check and describe it from that one declaration.

Every configurable value of streamtrain — a PS table's ``deltaKeepDays``, a worker's
``batchSize``, a job's ``checkpoint.everyPasses``, the operator's ``STREAMTRAIN_PS_PORT`` —
is a field of a frozen dataclass declared with :func:`setting`: its name and type are the
field's, its default, bounds and documentation are the ``setting(...)`` arguments. From that
single declaration

- :func:`parse` builds the dataclass from a JSON/YAML mapping (the manifest, the JSON the
  operator renders for the PS and the workers), checking types, enums (``Literal``), bounds
  and unknown fields, then the section's own cross-field rules (its ``_validate(path)``);
- :func:`parse_env` builds it from environment variables (fields declared with ``env=``);
- the CRD generator (``streamtrain_tools.crdgen``) derives the OpenAPI schema, and from it
  the reference page ``docs/crd-reference.md``.

Each package declares its own sections (the PS its table and optimizers, the worker its
model and data, the operator the job-level ones) and the operator's job spec composes them,
so the PS never imports the layers above it. A field that must mean exactly what another
layer's field means is declared with :func:`same_as`, which copies that declaration.

Every error is a :class:`ConfigError` carrying the field's path as data (``exc.path``,
``exc.message``), so callers never take an error message apart. This module is pure: no
I/O, no imports beyond the standard library.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, field, fields, is_dataclass
from typing import Any, ClassVar, Literal, Self, TypeVar

__all__ = [
    "ConfigError",
    "as_json",
    "enum_values",
    "field_hints",
    "is_section",
    "parse",
    "parse_env",
    "parse_value",
    "same_as",
    "setting",
    "strip_optional",
]

T = TypeVar("T")


class ConfigError(ValueError):
    """A setting is missing, mistyped or out of range.

    ``path`` is where, as data (``spec.sparse.deltaKeepDays``, ``ps.tables[0].name``, an
    environment variable's name); ``message`` is what is wrong. ``str(exc)`` joins them.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:  # pickles with both arguments
        return (type(self), (self.path, self.message))


def unknown_field(name: str, known: typing.Iterable[str]) -> str:
    """The message for an unknown field: the closest known name first (a typo is the usual
    cause; compared case-insensitively), then every known name."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    listed = ", ".join(sorted(by_lower.values()))
    if close:
        return f"unknown field; did you mean {by_lower[close[0]]}? (known: {listed})"
    return f"unknown field (known: {listed})"


#: Keyword arguments of :func:`setting` -> the metadata key (the OpenAPI keyword) they set.
_BOUNDS = {
    "minimum": "minimum",
    "maximum": "maximum",
    "exclusive_minimum": "exclusiveMinimum",
    "exclusive_maximum": "exclusiveMaximum",
    "min_length": "minLength",
    "max_length": "maxLength",
    "pattern": "pattern",
    "pattern_doc": "patternDoc",
    "min_items": "minItems",
    "item_minimum": "itemMinimum",
    "item_min_length": "itemMinLength",
}


def setting(
    default: Any = MISSING,
    doc: str = "",
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: float | None = None,
    exclusive_maximum: float | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
    pattern_doc: str | None = None,
    min_items: int | None = None,
    item_minimum: float | None = None,
    item_min_length: int | None = None,
    env: str | None = None,
) -> Any:
    """Declare one setting: a dataclass field with its doc, bounds and (optionally) the
    environment variable it is read from.

    ``default`` may be a value, a mutable list/dict (copied per instance) or a section
    dataclass type (a fresh default instance); without one the setting is required.
    Numeric bounds are inclusive unless named ``exclusive_``; ``item_*`` bound every item
    of a list; ``pattern_doc`` says in words what ``pattern`` accepts (for error messages).
    """
    given = {
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "exclusive_maximum": exclusive_maximum,
        "min_length": min_length,
        "max_length": max_length,
        "pattern": pattern,
        "pattern_doc": pattern_doc,
        "min_items": min_items,
        "item_minimum": item_minimum,
        "item_min_length": item_min_length,
    }
    metadata: dict[str, Any] = {"doc": doc}
    metadata.update({_BOUNDS[k]: v for k, v in given.items() if v is not None})
    if env is not None:
        metadata["env"] = env
    return _field(default, metadata)


def same_as(
    owner: type[Any],
    name: str,
    doc: str | None = None,
    required: bool = False,
    env: str | None = None,
) -> Any:
    """The declaration of ``owner.name`` again, for a field that must mean the same thing
    in another section (same default and bounds; its own ``doc`` if given). ``required``
    drops the default: the composing layer insists on a value the owner can do without.
    ``env`` names the environment variable the copy is read from (:func:`parse_env`). The
    copy's metadata names the original (``sameAs``), so tests can tell a copy from a second
    declaration."""
    original = {f.name: f for f in fields(owner)}[name]
    metadata = dict(original.metadata)
    metadata.setdefault("sameAs", f"{owner.__name__}.{name}")  # where it is declared
    if doc is not None:
        metadata["doc"] = doc
    if env is not None:
        metadata["env"] = env
    if required:
        return field(metadata=metadata)
    if original.default_factory is not MISSING:
        return field(default_factory=original.default_factory, metadata=metadata)
    return field(default=original.default, metadata=metadata)


def _field(default: Any, metadata: dict[str, Any]) -> Any:
    if default is MISSING:
        return field(metadata=metadata)
    if isinstance(default, type) and is_dataclass(default):
        return field(default_factory=default, metadata=metadata)
    if isinstance(default, list | dict):  # a fresh copy per instance
        return field(default_factory=functools.partial(type(default), default), metadata=metadata)
    return field(default=default, metadata=metadata)


# ------------------------------------------------------------------------- introspection


def field_hints(cls: type[Any]) -> dict[str, Any]:
    """The resolved type hints of a settings dataclass."""
    return typing.get_type_hints(cls)


def strip_optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; anything else -> ``(hint, False)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def enum_values(hint: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal`` type (optionally ``| None``), else ``None``."""
    hint = strip_optional(hint)[0]
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    return None


def is_section(hint: Any) -> bool:
    """Whether a (non-optional) type is a nested settings dataclass."""
    return isinstance(hint, type) and is_dataclass(hint)


def default_of(f: Field[Any]) -> Any:
    """A field's default value (a fresh one for factories), or ``MISSING``."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


# ------------------------------------------------------------------------------- parsing


def parse(cls: type[T], data: Any, path: str, *, error: type[ConfigError] = ConfigError) -> T:
    """Build settings dataclass ``cls`` from a JSON/YAML mapping found at ``path``.

    Missing fields take their declared default (a field without one is required), unknown
    fields are errors, every value is checked against its type and bounds, and nested
    sections are parsed the same way; then each section's ``_validate(path)``, if it has
    one, checks its cross-field rules. Every error is raised as ``error`` (a
    :class:`ConfigError` subclass the caller's layer catches) with its path.
    """
    try:
        return _section(cls, data, path)
    except ConfigError as exc:
        if isinstance(exc, error):
            raise
        raise error(exc.path, exc.message) from exc


def _section(cls: type[T], data: Any, path: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must be an object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}", unknown_field(unknown[0], known))
    hints = field_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        fpath = f"{path}.{name}"
        if name in data:
            kwargs[name] = parse_value(hints[name], data[name], fpath, f.metadata)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(fpath, "required")
    obj = cls(**kwargs)
    validate = getattr(obj, "_validate", None)
    if validate is not None:
        validate(path)
    return obj


def parse_value(hint: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    """Check one value against its type hint and declared bounds; returns it typed
    (lists become tuples, ints become floats where a float is declared)."""
    hint, optional = strip_optional(hint)
    if value is None:
        if optional:
            return None
        raise ConfigError(path, "must not be null")
    if is_section(hint):
        return _section(hint, value, path)
    choices = enum_values(hint)
    if choices is not None:
        if value not in choices:
            raise ConfigError(path, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    origin = typing.get_origin(hint)
    if origin is tuple:
        return _tuple(hint, value, path, meta)
    if origin is dict:
        return _dict(hint, value, path)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"must be a string, got {value!r}")
        _check_string(value, path, meta)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"must be an integer, got {value!r}")
        _check_bounds(value, path, meta)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(path, f"must be a number, got {value!r}")
        _check_bounds(float(value), path, meta)
        return float(value)
    raise TypeError(f"{path}: no parser for {hint!r}")  # a declaration bug, not bad input


def _tuple(hint: Any, value: Any, path: str, meta: Mapping[str, Any]) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise ConfigError(path, f"must be a list, got {value!r}")
    args = typing.get_args(hint)
    variadic = len(args) == 2 and args[1] is Ellipsis
    if not variadic and len(value) != len(args):
        raise ConfigError(path, f"must have {len(args)} items, got {len(value)}")
    if len(value) < meta.get("minItems", 0):
        raise ConfigError(path, f"must have at least {meta['minItems']} item(s)")
    item_meta = {
        bound: meta[key]
        for key, bound in (("itemMinimum", "minimum"), ("itemMinLength", "minLength"))
        if key in meta
    }
    return tuple(
        parse_value(args[0] if variadic else args[i], v, f"{path}[{i}]", item_meta)
        for i, v in enumerate(value)
    )


def _dict(hint: Any, value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"must be an object, got {value!r}")
    if typing.get_args(hint)[1] is Any:  # free-form, judged by the owning section
        return {str(k): v for k, v in value.items()}
    out: dict[str, Any] = {}
    for k, v in value.items():  # string maps also take numbers (quantities: cpu: 4)
        if isinstance(v, bool) or not isinstance(v, str | int | float):
            raise ConfigError(f"{path}.{k}", f"must be a string, got {v!r}")
        out[str(k)] = str(v)
    return out


def _check_string(value: str, path: str, meta: Mapping[str, Any]) -> None:
    if len(value) < meta.get("minLength", 0):
        raise ConfigError(path, "must not be empty")
    if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
        expected = (
            f"be {meta['patternDoc']}" if "patternDoc" in meta else f"match {meta['pattern']}"
        )
        raise ConfigError(path, f"must {expected}, got {value!r}")
    if "maxLength" in meta and len(value) > meta["maxLength"]:
        raise ConfigError(path, f"must be at most {meta['maxLength']} character(s), got {value!r}")


def _check_bounds(value: float, path: str, meta: Mapping[str, Any]) -> None:
    if "minimum" in meta and value < meta["minimum"]:
        raise ConfigError(path, f"must be >= {meta['minimum']}, got {value}")
    if "maximum" in meta and value > meta["maximum"]:
        raise ConfigError(path, f"must be <= {meta['maximum']}, got {value}")
    if "exclusiveMinimum" in meta and not value > meta["exclusiveMinimum"]:
        raise ConfigError(path, f"must be > {meta['exclusiveMinimum']}, got {value}")
    if "exclusiveMaximum" in meta and not value < meta["exclusiveMaximum"]:
        raise ConfigError(path, f"must be < {meta['exclusiveMaximum']}, got {value}")


# --------------------------------------------------------------------------- environment


def parse_env(cls: type[T], env: Mapping[str, str], *, error: type[ConfigError] = ConfigError) -> T:
    """Build ``cls`` from environment variables: each field declared with ``env=NAME`` is
    read from ``NAME``; unset or empty variables keep the default. The text is decoded by
    the field's type (integers, numbers, ``true``/``false``, JSON for lists and objects)
    and then checked exactly like a JSON value; errors carry the variable's name as path."""
    try:
        hints = field_hints(cls)
        kwargs: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            name = f.metadata.get("env")
            raw = env.get(name) if name else None
            if name and raw:
                value = _decode(hints[f.name], raw, name)
                kwargs[f.name] = parse_value(hints[f.name], value, name, f.metadata)
        obj = cls(**kwargs)
        validate = getattr(obj, "_validate", None)
        if validate is not None:
            validate("env")
        return obj
    except ConfigError as exc:
        if isinstance(exc, error):
            raise
        raise error(exc.path, exc.message) from exc


def _decode(hint: Any, raw: str, name: str) -> Any:
    base = strip_optional(hint)[0]
    if base is bool:
        if raw.lower() not in ("true", "false"):
            raise ConfigError(name, f"must be true or false, got {raw!r}")
        return raw.lower() == "true"
    if base is int:
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if base is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(name, f"must be a number, got {raw!r}") from None
    if base is str or enum_values(base) is not None:
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(name, f"not valid JSON: {exc}") from None


# ------------------------------------------------------------------------------- output


def as_json(value: Any) -> Any:
    """A settings dataclass (or a value inside one) as plain JSON data: objects, lists,
    strings, numbers, booleans and nulls; it parses back to an equal dataclass."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value


class Document:
    """A settings dataclass that is a whole JSON document the operator renders (a shard's
    or a worker's config): its JSON form, written and parsed here once. ``document`` names
    it in errors (``ps``, ``worker``, ``data``); ``errors`` is the ``ConfigError`` subclass
    its parse raises."""

    document: ClassVar[str]
    errors: ClassVar[type[ConfigError]] = ConfigError

    def to_dict(self) -> dict[str, Any]:
        """The camelCase JSON form (round-trips through ``from_dict``)."""
        out: dict[str, Any] = as_json(self)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, path: str | None = None) -> Self:
        """Parse the rendered JSON object; errors carry ``<path>.<field>``."""
        return parse(cls, data, cls.document if path is None else path, error=cls.errors)

    @classmethod
    def from_json(cls, text: str) -> Self:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cls.document} config", f"not valid JSON: {exc}") from exc
        return cls.from_dict(data)
