"""Explicit, cheap validation of decoded JSON (the hot path of every request).

Plain `type(x) is T` checks instead of model validation: a request body is validated once, field by
field, and every failure names its JSON path. `bool` is never accepted where a number is expected
(JSON `true` is not `1`).
"""

from __future__ import annotations

import math
from typing import Any

from agentserve.api.errors import InvalidRequestError

_JSON_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def describe(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def at(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def wrong_type(path: str, expected: str, value: Any) -> InvalidRequestError:
    return InvalidRequestError(f"expected {expected}, got {describe(value)}", param=path)


def expect_dict(value: Any, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise wrong_type(path, "an object", value)
    return value


def expect_list(value: Any, path: str) -> list[Any]:
    if type(value) is not list:
        raise wrong_type(path, "an array", value)
    return value


def missing(path: str) -> InvalidRequestError:
    return InvalidRequestError("field required", param=path)


def opt_str(d: dict[str, Any], key: str, path: str) -> str | None:
    value = d.get(key)
    if value is None or type(value) is str:
        return value
    raise wrong_type(at(path, key), "a string", value)


def req_str(d: dict[str, Any], key: str, path: str, *, nonempty: bool = False) -> str:
    value = d.get(key)
    if type(value) is str:
        if nonempty and not value:
            raise InvalidRequestError("must not be empty", param=at(path, key))
        return value
    if value is None:
        raise missing(at(path, key))
    raise wrong_type(at(path, key), "a string", value)


def opt_bool(d: dict[str, Any], key: str, path: str) -> bool | None:
    value = d.get(key)
    if value is None or type(value) is bool:
        return value
    raise wrong_type(at(path, key), "a boolean", value)


def opt_int(
    d: dict[str, Any], key: str, path: str, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if type(value) is float and value.is_integer():
        value = int(value)  # some clients serialise 1024 as 1024.0
    if type(value) is not int:
        raise wrong_type(at(path, key), "an integer", value)
    if minimum is not None and value < minimum:
        raise InvalidRequestError(f"must be >= {minimum}", param=at(path, key))
    if maximum is not None and value > maximum:
        raise InvalidRequestError(f"must be <= {maximum}", param=at(path, key))
    return value


def opt_number(
    d: dict[str, Any],
    key: str,
    path: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if type(value) is not int and type(value) is not float:
        raise wrong_type(at(path, key), "a number", value)
    number = float(value)
    if not math.isfinite(number):
        raise InvalidRequestError("must be a finite number", param=at(path, key))
    if minimum is not None and number < minimum:
        raise InvalidRequestError(f"must be >= {minimum:g}", param=at(path, key))
    if maximum is not None and number > maximum:
        raise InvalidRequestError(f"must be <= {maximum:g}", param=at(path, key))
    return number


def opt_dict(d: dict[str, Any], key: str, path: str) -> dict[str, Any] | None:
    value = d.get(key)
    if value is None or type(value) is dict:
        return value
    raise wrong_type(at(path, key), "an object", value)


def opt_list(d: dict[str, Any], key: str, path: str) -> list[Any] | None:
    value = d.get(key)
    if value is None or type(value) is list:
        return value
    raise wrong_type(at(path, key), "an array", value)


def str_list(value: Any, path: str, *, max_items: int | None = None) -> tuple[str, ...]:
    items = expect_list(value, path)
    if max_items is not None and len(items) > max_items:
        raise InvalidRequestError(f"at most {max_items} items allowed", param=path)
    for i, item in enumerate(items):
        if type(item) is not str:
            raise wrong_type(at(path, i), "a string", item)
    return tuple(items)


def one_of(value: str, allowed: tuple[str, ...], path: str) -> str:
    if value not in allowed:
        raise InvalidRequestError(
            f"must be one of {', '.join(map(repr, allowed))}, got {value!r}", param=path
        )
    return value
