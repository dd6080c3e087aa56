"""The one settings parser: every error carries its field's path as data, declarations
drive types, enums and bounds, environment variables are decoded then checked the same way."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, fields
from typing import Any, Literal

import pytest

from streamtrain_ps.plumbing.settings import (
    ConfigError,
    as_json,
    parse,
    parse_env,
    same_as,
    setting,
)


@dataclass(frozen=True)
class Inner:
    """A nested section."""

    rate: float = setting(0.5, "A rate.", exclusive_minimum=0, maximum=1)
    kind: Literal["a", "b"] = setting("a", "An enum.")

    def _validate(self, path: str) -> None:
        if self.kind == "b" and self.rate == 1:
            raise ConfigError(f"{path}.rate", "kind b needs a rate below 1")


@dataclass(frozen=True)
class Outer:
    """A section with one of every kind of setting."""

    name: str = setting(doc="Required, non-empty.", min_length=1)
    count: int = setting(3, "Bounded integer.", minimum=1, maximum=10)
    day: str | None = setting(None, "Optional day.", pattern=r"^[0-9]{8}$", max_length=8)
    quote: str = setting('"', "One printable char.", pattern="^[ -~]?$", pattern_doc="one char")
    widths: tuple[int, ...] = setting((4, 2), "Widths.", item_minimum=1, min_items=1)
    names: tuple[str, ...] = setting((), "Names.", item_min_length=1)
    pair: tuple[float, float] = setting((0.0, 1.0), "Exactly two numbers.")
    labels: dict[str, str] = setting({}, "String map.")
    free: dict[str, Any] = setting({}, "Free-form map.")
    flag: bool = setting(True, "A boolean.")
    inner: Inner = setting(Inner, "Nested.")


def error(data: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse(Outer, data, "top")
    return caught.value


def test_defaults_and_types() -> None:
    got = parse(Outer, {"name": "x", "widths": [8], "pair": [1, 2], "labels": {"cpu": 4}}, "top")
    assert got == Outer(name="x", widths=(8,), pair=(1.0, 2.0), labels={"cpu": "4"})
    assert isinstance(got.pair[0], float)
    assert got.inner == Inner()
    # Mutable defaults are fresh per instance.
    assert Outer(name="a").labels is not Outer(name="b").labels


def test_json_round_trip() -> None:
    value = Outer(name="x", widths=(1, 2), free={"a": [1, {"b": 2}]}, inner=Inner(0.25, "b"))
    assert parse(Outer, as_json(value), "top") == value
    assert as_json(value)["widths"] == [1, 2]


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        ([], "top", "must be an object, got list"),
        ({}, "top.name", "required"),
        ({"name": ""}, "top.name", "must not be empty"),
        ({"name": "x", "nmae": 1}, "top.nmae", "unknown field; did you mean name? (known: count, "),
        ({"name": "x", "COUNT": 1}, "top.COUNT", "unknown field; did you mean count? (known: "),
        ({"name": 3}, "top.name", "must be a string, got 3"),
        ({"name": "x", "count": 0}, "top.count", "must be >= 1, got 0"),
        ({"name": "x", "count": 11}, "top.count", "must be <= 10, got 11"),
        ({"name": "x", "count": 2.5}, "top.count", "must be an integer, got 2.5"),
        ({"name": "x", "count": True}, "top.count", "must be an integer, got True"),
        ({"name": "x", "count": None}, "top.count", "must not be null"),
        ({"name": "x", "day": "2026-1-1"}, "top.day", "must match ^[0-9]{8}$"),
        ({"name": "x", "quote": "ab"}, "top.quote", "must be one char, got 'ab'"),
        ({"name": "x", "widths": []}, "top.widths", "must have at least 1 item(s)"),
        ({"name": "x", "widths": [3, 0]}, "top.widths[1]", "must be >= 1, got 0"),
        ({"name": "x", "widths": 3}, "top.widths", "must be a list, got 3"),
        ({"name": "x", "names": ["a", ""]}, "top.names[1]", "must not be empty"),
        ({"name": "x", "pair": [1]}, "top.pair", "must have 2 items, got 1"),
        ({"name": "x", "pair": [1, "2"]}, "top.pair[1]", "must be a number, got '2'"),
        ({"name": "x", "labels": {"a": [1]}}, "top.labels.a", "must be a string, got [1]"),
        ({"name": "x", "free": []}, "top.free", "must be an object, got []"),
        ({"name": "x", "flag": "yes"}, "top.flag", "must be true or false, got 'yes'"),
        ({"name": "x", "inner": {"rate": 0}}, "top.inner.rate", "must be > 0, got 0.0"),
        ({"name": "x", "inner": {"rate": 2}}, "top.inner.rate", "must be <= 1, got 2.0"),
        ({"name": "x", "inner": {"kind": "c"}}, "top.inner.kind", "must be one of a, b, got 'c'"),
        ({"name": "x", "inner": {"rate": 1, "kind": "b"}}, "top.inner.rate", "kind b needs"),
        ({"name": "x", "inner": {"x": 1}}, "top.inner.x", "unknown field (known: kind, rate)"),
    ],
)
def test_errors_carry_the_path_as_data(data: Any, path: str, message: str) -> None:
    err = error(data)
    assert err.path == path
    assert err.message.startswith(message), err.message
    assert str(err) == f"{path}: {err.message}"


def test_errors_are_raised_as_the_callers_class_and_pickle() -> None:
    class LayerError(ConfigError):
        pass

    with pytest.raises(LayerError) as caught:
        parse(Outer, {"name": "x", "inner": {"rate": 5}}, "spec", error=LayerError)
    assert caught.value.path == "spec.inner.rate"
    assert isinstance(caught.value.__cause__, ConfigError)
    copy = pickle.loads(pickle.dumps(ConfigError("a.b", "bad")))
    assert (copy.path, copy.message) == ("a.b", "bad")


@dataclass(frozen=True)
class FromEnv:
    port: int = setting(8080, "A port.", minimum=1, env="APP_PORT")
    poll: float = setting(1.5, "Seconds.", exclusive_minimum=0, env="APP_POLL")
    on: bool = setting(True, "A switch.", env="APP_ON")
    server: str | None = setting(None, "A URL.", env="APP_SERVER")
    labels: dict[str, str] = setting({"a": "b"}, "JSON object.", env="APP_LABELS")
    peers: tuple[dict[str, Any], ...] = setting((), "JSON list.", env="APP_PEERS")
    internal: int = setting(7, "Not read from the environment.")


def test_env_settings_are_decoded_then_checked_like_json() -> None:
    assert parse_env(FromEnv, {}) == FromEnv()
    assert parse_env(FromEnv, {"APP_PORT": "", "APP_SERVER": ""}) == FromEnv()
    got = parse_env(
        FromEnv,
        {
            "APP_PORT": "9",
            "APP_POLL": "0.25",
            "APP_ON": "FALSE",
            "APP_SERVER": "http://k",
            "APP_LABELS": '{"x": "y"}',
            "APP_PEERS": '[{"podSelector": {}}]',
            "internal": "3",
        },
    )
    assert got == FromEnv(
        port=9,
        poll=0.25,
        on=False,
        server="http://k",
        labels={"x": "y"},
        peers=({"podSelector": {}},),
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"APP_PORT": "x"}, "must be an integer, got 'x'"),
        ({"APP_PORT": "0"}, "must be >= 1, got 0"),
        ({"APP_POLL": "0"}, "must be > 0, got 0.0"),
        ({"APP_POLL": "soon"}, "must be a number, got 'soon'"),
        ({"APP_ON": "maybe"}, "must be true or false, got 'maybe'"),
        ({"APP_LABELS": "{"}, "not valid JSON"),
        ({"APP_LABELS": "[1]"}, "must be an object, got [1]"),
        ({"APP_PEERS": "{}"}, "must be a list, got {}"),
    ],
)
def test_env_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_env(FromEnv, env)
    assert caught.value.path == next(iter(env))
    assert caught.value.message.startswith(message), caught.value.message


def test_same_as_copies_a_declaration() -> None:
    @dataclass(frozen=True)
    class Copies:
        name: str = same_as(Outer, "name")
        rate: float = same_as(Inner, "rate", required=True)
        count: int = same_as(Outer, "count")
        widths: tuple[int, ...] = same_as(Outer, "widths", doc="Other words.")

    by_name = {f.name: f for f in fields(Copies)}
    original = {f.name: f for f in fields(Outer)}
    copied = dict(by_name["count"].metadata)
    assert copied.pop("sameAs") == "Outer.count"
    assert copied == original["count"].metadata
    assert by_name["count"].default == 3
    assert by_name["widths"].metadata["doc"] == "Other words."
    assert by_name["widths"].metadata["itemMinimum"] == 1
    with pytest.raises(ConfigError) as caught:
        parse(Copies, {"name": "x", "rate": 1, "count": 0}, "c")
    assert caught.value.path == "c.count"
    with pytest.raises(ConfigError) as caught:
        parse(Copies, {"name": "x"}, "c")
    assert (caught.value.path, caught.value.message) == ("c.rate", "required")


def test_a_declaration_without_a_parser_is_a_programming_error() -> None:
    @dataclass(frozen=True)
    class Bad:
        when: complex = setting(0j, "No parser for complex numbers.")

    with pytest.raises(TypeError, match=r"b\.when: no parser"):
        parse(Bad, {"when": 1}, "b")
