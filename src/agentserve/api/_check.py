"""Explicit, cheap validation of decoded JSON (the hot path of every request).

Plain `type(x) is T` checks instead of model validation: a request body is validated once, field by
field, and every failure names its JSON path. `bool` is never accepted where a number is expected
(JSON `true` is not `1`).
"""

from __future__ import annotations

import math
import re
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


def req_dict(d: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = opt_dict(d, key, path)
    if value is None:
        raise missing(at(path, key))
    return value


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


MAX_NAME = 256  # model and tool names: generous (OpenAI allows 64-character function names)


def req_name(d: dict[str, Any], key: str, path: str) -> str:
    """A non-empty name of at most `MAX_NAME` characters (a model, a tool)."""
    value = req_str(d, key, path, nonempty=True)
    if len(value) > MAX_NAME:
        raise InvalidRequestError(f"must be at most {MAX_NAME} characters", param=at(path, key))
    return value


def object_schema(schema: dict[str, Any] | None, path: str) -> dict[str, Any] | None:
    """A tool's parameters are an object's JSON Schema (OpenAI: `{}` too, no parameters)."""
    if schema is not None and "type" in schema and schema["type"] != "object":
        got = schema["type"] if type(schema["type"]) is str else describe(schema["type"])
        raise InvalidRequestError(
            f"schema must be a JSON Schema of 'type: \"object\"', got 'type: {got}'", param=at(path, "type")
        )
    return schema


def openai_metadata(value: dict[str, Any] | None, path: str) -> dict[str, Any] | None:
    """OpenAI's `metadata` (Chat and Responses): at most 16 pairs, keys of at most 64 characters,
    string values of at most 512; refused with OpenAI's own wording and `param`."""
    if value is None:
        return None
    if len(value) > 16:
        raise InvalidRequestError(
            f"Invalid '{path}': too many properties. Expected an object with at most 16 properties, "
            f"but got an object with {len(value)} properties instead.",
            param=path,
        )
    for key, item in value.items():
        if len(key) > 64:
            raise InvalidRequestError(
                f"Invalid '{path}': property name too long. Expected a string with maximum length 64, "
                f"but got a string with length {len(key)} instead.",
                param=path,
            )
        if type(item) is not str:
            raise wrong_type(at(path, key), "a string", item)
        if len(item) > 512:
            raise InvalidRequestError(
                f"Invalid '{at(path, key)}': string too long. Expected a string with maximum length 512, "
                f"but got a string with length {len(item)} instead.",
                param=at(path, key),
            )
    return value


def one_of(value: str, allowed: tuple[str, ...], path: str) -> str:
    if value not in allowed:
        raise InvalidRequestError(
            f"must be one of {', '.join(map(repr, allowed))}, got {value!r}", param=path
        )
    return value


# -- lone surrogates and nesting depth -------------------------------------------------------------

MAX_DEPTH = 64  # free-form JSON (tool schemas, tool inputs): real ones stay under 20 levels

# A lone surrogate can only arrive as a `\udXXX` escape or as its raw (CESU-style) UTF-8 bytes,
# which `json.loads` lets through. A body with neither (nearly all) needs no string scan.
_ESCAPE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")
_RAW_HINT = re.compile(rb"\xed[\xa0-\xbf]")


def _has_lone_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_surrogates(value: Any, raw: bytes) -> None:
    """Refuse a body with a lone surrogate (`\ud800`-`\udfff` without its pair) in any string or key:
    it has no UTF-8 form, so the tokenizer and every JSON writer would fail on it. Names the path.
    Costs one C-speed search of the raw bytes (~50 µs for 90 kB) unless the body shows a hint."""
    if _ESCAPE_HINT.search(raw) is None and (b"\xed" not in raw or _RAW_HINT.search(raw) is None):
        return
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, path = stack.pop()
        if type(node) is dict:
            for key in node:
                if _has_lone_surrogate(key):  # the path shows it escaped: a response must encode
                    raise InvalidRequestError(
                        _SURROGATE, param=at(path, key.encode("utf-8", "backslashreplace").decode())
                    )
            stack += [(v, at(path, k)) for k, v in reversed(node.items())]
        elif type(node) is list:
            stack += [(v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node)))]
        elif type(node) is str and _has_lone_surrogate(node):
            raise InvalidRequestError(_SURROGATE, param=path or "body")


_SURROGATE = "contains a lone UTF-16 surrogate (\\ud800-\\udfff without its pair): not valid Unicode"


def check_depth(value: Any, path: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """`value` (free-form JSON: a tool schema, a tool input) nested at most `max_depth` levels deep.
    Level by level over containers only (~0.15 µs per item); the path is found only on failure."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            raise InvalidRequestError(
                f"nested more than {max_depth} levels deep", param=_deep_path(value, path, max_depth)
            )
        below: list[Any] = []
        for node in level:
            below += [v for v in (node.values() if type(node) is dict else node) if type(v) in _CONTAINERS]
        level = below
    return value


_CONTAINERS = (dict, list)


def _deep_path(value: Any, path: str, max_depth: int) -> str:
    stack: list[tuple[Any, str, int]] = [(value, path, 1)]
    while stack:
        node, here, depth = stack.pop()
        if depth > max_depth:
            return here
        if type(node) is dict:
            stack += [(v, at(here, k), depth + 1) for k, v in node.items() if type(v) in _CONTAINERS]
        elif type(node) is list:
            stack += [(v, f"{here}[{i}]", depth + 1) for i, v in enumerate(node) if type(v) in _CONTAINERS]
    return path or "body"
