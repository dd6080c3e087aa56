"""Typed fields for the job spec: documented dataclass fields and the parser they drive.

A spec dataclass declares each field with :func:`spec_field` (default, ``doc`` and bounds in
``dataclasses.Field.metadata``); :func:`parse_dataclass` turns a JSON/YAML mapping into the
frozen dataclass, checking every value against its type hint and metadata and calling the
class's ``_validate(path)`` for cross-field rules. The same metadata generates the CRD
schema (``crdgen.py``), so what Kubernetes validates and what the parser validates cannot
drift apart. Every error is a :class:`SpecError` whose message starts with the field's path.

Supported hints: ``str``, ``int``, ``float``, ``bool``, ``Literal[...]`` (enums),
``X | None``, ``tuple[T, ...]`` / ``tuple[T, U]``, ``dict[str, str]``, ``dict[str, Any]``
(free-form, judged by the owning layer) and nested spec dataclasses. Metadata keys: ``doc``,
``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``minLength``,
``pattern``, ``itemMinimum``.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, field, fields, is_dataclass
from typing import Any, Literal

from streamtrain_ps.config import ConfigError


class SpecError(ConfigError):
    """The manifest is invalid; the message starts with the offending field's path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def spec_field(default: Any = MISSING, doc: str = "", **meta: Any) -> Any:
    """A dataclass field with its documentation and bounds in ``metadata``."""
    metadata = {"doc": doc, **meta}
    if isinstance(default, list | dict) or (isinstance(default, type) and is_dataclass(default)):
        factory = default if isinstance(default, type) else (lambda d=default: type(d)(d))
        return field(default_factory=factory, metadata=metadata)
    if default is MISSING:
        return field(metadata=metadata)
    return field(default=default, metadata=metadata)


def enum_values(hint: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal`` type (optionally ``| None``), else ``None``."""
    hint = strip_optional(hint)[0]
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    return None


def field_hints(cls: type[Any]) -> dict[str, Any]:
    """Resolved type hints of a spec dataclass (for schema generators)."""
    return typing.get_type_hints(cls)


def strip_optional(hint: Any) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def parse_dataclass(cls: type[Any], data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise SpecError(path, f"must be an object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise SpecError(
            f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})"
        )
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        fpath = f"{path}.{name}"
        if name in data:
            kwargs[name] = _value(hints[name], data[name], fpath, f.metadata)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise SpecError(fpath, "required")
    obj = cls(**kwargs)
    validate = getattr(obj, "_validate", None)
    if validate is not None:
        validate(path)
    return obj


def _value(hint: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    hint, optional = strip_optional(hint)
    if value is None:
        if optional:
            return None
        raise SpecError(path, "must not be null")
    if isinstance(hint, type) and is_dataclass(hint):
        return parse_dataclass(hint, value, path)
    choices = enum_values(hint)
    if choices is not None:
        if value not in choices:
            raise SpecError(path, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise SpecError(path, f"must be a list, got {value!r}")
        args = typing.get_args(hint)
        variadic = len(args) == 2 and args[1] is Ellipsis
        if not variadic and len(value) != len(args):
            raise SpecError(path, f"must have {len(args)} items, got {len(value)}")
        item_meta = {"minimum": meta["itemMinimum"]} if "itemMinimum" in meta else {}
        return tuple(
            _value(args[0] if variadic else args[i], v, f"{path}[{i}]", item_meta)
            for i, v in enumerate(value)
        )
    if origin is dict:
        if not isinstance(value, Mapping):
            raise SpecError(path, f"must be an object, got {value!r}")
        if typing.get_args(hint)[1] is Any:  # free-form, judged by the owning layer
            return {str(k): v for k, v in value.items()}
        out: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, str | int | float):
                raise SpecError(f"{path}.{k}", f"must be a string, got {v!r}")
            out[str(k)] = str(v)
        return out
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(path, f"must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(path, f"must be a string, got {value!r}")
        if len(value) < meta.get("minLength", 0):
            raise SpecError(path, "must not be empty")
        if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
            raise SpecError(path, f"must match {meta['pattern']}, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"must be an integer, got {value!r}")
        _check_bounds(value, path, meta)
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(path, f"must be a number, got {value!r}")
        _check_bounds(float(value), path, meta)
        return float(value)
    raise TypeError(f"{path}: no parser for {hint!r}")  # a programming error, not bad input


def _check_bounds(value: float, path: str, meta: Mapping[str, Any]) -> None:
    if "minimum" in meta and value < meta["minimum"]:
        raise SpecError(path, f"must be >= {meta['minimum']}, got {value}")
    if "maximum" in meta and value > meta["maximum"]:
        raise SpecError(path, f"must be <= {meta['maximum']}, got {value}")
    if "exclusiveMinimum" in meta and not value > meta["exclusiveMinimum"]:
        raise SpecError(path, f"must be > {meta['exclusiveMinimum']}, got {value}")
    if "exclusiveMaximum" in meta and not value < meta["exclusiveMaximum"]:
        raise SpecError(path, f"must be < {meta['exclusiveMaximum']}, got {value}")
