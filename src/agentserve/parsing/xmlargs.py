"""Arguments JSON built incrementally from XML-style parameters (Qwen3-Coder, GLM, MiniMax).

These formats write each argument as a key and a raw text value. `ArgsWriter` turns them into one
JSON object text, fragment by fragment through `ToolCalls.args`: `{`, `"key": `, the value, `, `, `}`.

The tool's JSON schema types each value (`properties[key]`):
- `string` values stream as JSON-escaped fragments the moment their text arrives; they are never
  held until the close tag.
- integer / number / boolean / null / object / array values are buffered to the end of the value and
  converted (object and array also accept Python literals); text that does not convert becomes a
  JSON string, never an exception.
- unions (`anyOf`, `oneOf`, type lists, `nullable`) try their non-string types in order, then string,
  so an object is never double-encoded. A union that allows string streams speculatively: the value is
  held only while it could still be one of the other types (a prefix of `null`, a number, or text
  opening with `{`/`[`), and streams as a string from the first character that rules them out.
- a key missing from the schema, or a tool missing from the declared tools, is a string (vLLM's rule).
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings
from collections.abc import Mapping
from enum import IntEnum
from typing import Any

from agentserve.conversation import OutputEvent, ToolSpec
from agentserve.parsing.toolcalls import ToolCalls
from agentserve.schema_refs import deref, has_local_refs, inlined

STRING = "string"
_KNOWN = frozenset({"string", "integer", "number", "boolean", "null", "object", "array"})
_ALIASES = {
    "str": "string",
    "text": "string",
    "int": "integer",
    "float": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "none": "null",
}
_STRING_ONLY: tuple[str, ...] = (STRING,)
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (dict, "object"),
    (list, "array"),
    (type(None), "null"),
)

# Characters JSON must escape inside a string; most fragments have none and are sent as they are.
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')
# Every prefix of a number this module accepts (JSON numbers, `1.`, `.5`, `+2`) matches this.
_NUMBER_PREFIX = re.compile(r"[+-]?[0-9]*\.?[0-9]*(?:[eE][+-]?[0-9]*)?")
_LOOSE_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# A union value longer than this that is not a container is no scalar: stream it as a string
# (bounds what is held, and keeps the could-it-still-be check constant time).
SPECULATE_LIMIT = 256


class ValueMode(IntEnum):
    """How a parameter's value is written while it arrives."""

    STREAM = 0  # a string: each fragment escaped and sent as it comes
    BUFFER = 1  # a scalar or container: held until its end, then converted by the schema's type
    SPECULATE = 2  # a union with string: held while it could still be another type, then streamed


_STREAM, _BUFFER, _SPECULATE = ValueMode.STREAM, ValueMode.BUFFER, ValueMode.SPECULATE


def escape(text: str) -> str:
    """`text` as the inside of a JSON string (fragments escape independently, so they concatenate)."""
    if _NEEDS_ESCAPE.search(text) is None:
        return text
    return json.dumps(text, ensure_ascii=False)[1:-1]


def tool_properties(tools: Mapping[str, ToolSpec], name: str) -> Mapping[str, Any]:
    """The `properties` of a declared tool's parameters schema; empty when unknown or not a mapping."""
    spec = tools.get(name)
    if spec is None or not isinstance(spec.parameters, Mapping):
        return {}
    root = spec.parameters
    props = deref(root, root).get("properties")
    if not isinstance(props, Mapping):
        return {}
    if has_local_refs(props):  # pydantic's nested models and enums: `{"$ref": "#/$defs/Color"}`
        return {k: inlined(v, root) for k, v in props.items()}
    return props


def tool_required(tools: Mapping[str, ToolSpec], name: str) -> frozenset[str]:
    """The `required` parameter names of a declared tool (empty when unknown)."""
    spec = tools.get(name)
    if spec is None or not isinstance(spec.parameters, Mapping):
        return frozenset()
    required = spec.parameters.get("required")
    if not isinstance(required, list):
        return frozenset()
    return frozenset(r for r in required if isinstance(r, str))


def value_types(schema: object) -> tuple[str, ...]:
    """The JSON types a schema allows, in the order to try them: non-string types first, then string.

    `("string",)` when nothing typed is known (a missing or untyped schema is a string).
    """
    found: list[str] = []
    _collect_types(schema, found, 0)
    if not found:
        return _STRING_ONLY
    ordered = [t for t in found if t != STRING]
    if STRING in found:
        ordered.append(STRING)
    return tuple(ordered)


def _collect_types(schema: object, found: list[str], depth: int) -> None:
    if not isinstance(schema, Mapping) or depth > 8:
        return
    declared = schema.get("type")
    names = declared if isinstance(declared, list) else [declared] if declared is not None else []
    for name in names:
        if isinstance(name, str):
            _add(found, _ALIASES.get(name.strip().lower(), name.strip().lower()))
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            for branch in branches:
                _collect_types(branch, found, depth + 1)
    if not names and not any(key in schema for key in ("anyOf", "oneOf", "allOf")):
        # Untyped schemas that still say what they hold (a branch of a union too).
        if isinstance(schema.get("properties"), Mapping):
            _add(found, "object")
        elif "items" in schema:
            _add(found, "array")
        elif isinstance(schema.get("enum"), list):
            for item in schema["enum"]:
                _add(found, _json_type(item))
        elif "const" in schema:
            _add(found, _json_type(schema["const"]))
    if found and schema.get("nullable") is True:
        _add(found, "null")


def _add(found: list[str], name: str) -> None:
    if name in _KNOWN and name not in found:
        found.append(name)


def _json_type(value: object) -> str:
    for py, name in _JSON_TYPES:
        if isinstance(value, py):
            return name
    return STRING


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _INVALID


_INVALID: Any = object()


def _dumps(value: Any) -> str | None:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None


def _literal(text: str) -> Any:
    """A Python literal (`{'a': True}`), for models that write dicts and lists the Python way."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for "\d" inside a literal string
            return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _INVALID


def convert(text: str, kind: str) -> str | None:
    """The JSON text of `text` read as a value of JSON type `kind`, or None if it is not one."""
    s = text.strip()
    if kind == "integer":
        v = _loads(s)
        if type(v) is int:
            return str(v)
        if type(v) is float and v.is_integer():
            return str(int(v))
        return None
    if kind == "number":
        v = _loads(s)
        if type(v) is int:
            return str(v)
        if type(v) is not float and _LOOSE_NUMBER.fullmatch(s):
            v = float(s)
        if type(v) is float and math.isfinite(v):
            return _dumps(v)
        return None
    if kind == "boolean":
        low = s.lower()
        return low if low in ("true", "false") else None
    if kind == "null":
        return "null" if s.lower() in ("null", "none") else None
    if kind in ("object", "array"):
        want: type = dict if kind == "object" else list
        if not s.startswith("{" if kind == "object" else "["):
            return None
        v = _loads(s)
        if not isinstance(v, want):
            v = _literal(s)
        return _dumps(v) if isinstance(v, want) else None
    if kind == STRING:
        return '"' + escape(text) + '"'
    return None


def _converted(text: str, types: tuple[str, ...]) -> str:
    for kind in types:
        converted = convert(text, kind)
        if converted is not None:
            return converted
    # Not the declared type. A non-string parameter written `null` is null (templates render None
    # that way); anything else keeps the model's text as a string.
    return "null" if text.strip() == "null" else '"' + escape(text) + '"'


def read_value(text: str, types: tuple[str, ...]) -> str:
    """The JSON text a whole value `text` of a parameter typed `types` (`value_types`) is read as:
    what `ArgsWriter` sends for it (the constraint grammars write only texts read back as valid)."""
    if types == _STRING_ONLY:
        return '"' + escape(text) + '"'
    return _converted(text, types)


def _could_be(s: str, kind: str) -> bool:
    """Could a value whose text starts with `s` (no leading whitespace) still convert to `kind`?"""
    body = s.rstrip()
    if kind in ("integer", "number"):
        return _NUMBER_PREFIX.fullmatch(body) is not None
    low = body.lower()
    if kind == "boolean":
        return "true".startswith(low) or "false".startswith(low)
    if kind == "null":
        return "null".startswith(low) or "none".startswith(low)
    if kind == "object":
        return s[0] == "{"
    if kind == "array":
        return s[0] == "["
    return False


class ArgsWriter:
    """Streams one call's arguments object: `begin(key)`, `text(…)`…, `end()` per parameter, then
    `finish()` closes the object and dispatches the call (or reports it)."""

    __slots__ = ("_calls", "_count", "_held", "_held_len", "_mode", "_props", "_sticky", "_types")

    def __init__(self, calls: ToolCalls, properties: Mapping[str, Any]) -> None:
        self._calls = calls
        self._props = properties
        self._count = 0
        self._mode = _STREAM
        self._types: tuple[str, ...] = _STRING_ONLY
        self._held: list[str] = []
        self._held_len = 0
        self._sticky = False  # a union value that opened as a container: held to its end

    def begin(self, key: str, out: list[OutputEvent]) -> None:
        prefix = ("{" if self._count == 0 else ", ") + json.dumps(key, ensure_ascii=False) + ": "
        self._count += 1
        types = value_types(self._props.get(key)) if self._props else _STRING_ONLY
        self._types = types
        self._held = []
        self._held_len = 0
        self._sticky = False
        if types == _STRING_ONLY:
            self._mode = _STREAM
            self._calls.args(prefix + '"', out)
        else:
            self._mode = _SPECULATE if types[-1] == STRING else _BUFFER
            self._calls.args(prefix, out)

    def text(self, fragment: str, out: list[OutputEvent]) -> None:
        if not fragment:
            return
        mode = self._mode
        if mode == _STREAM:
            self._calls.args(escape(fragment), out)
            return
        self._held.append(fragment)
        self._held_len += len(fragment)
        if mode == _SPECULATE and not self._sticky and not self._still_typed():
            # From here on it can only be a string: send what was held and stream the rest.
            self._mode = _STREAM
            self._calls.args('"' + escape("".join(self._held)), out)
            self._held = []

    def _still_typed(self) -> bool:
        held = "".join(self._held)
        s = held.lstrip()
        if not s:
            return True
        for kind in self._types[:-1]:
            if kind in ("object", "array"):
                if _could_be(s, kind):
                    self._sticky = True
                    return True
            elif self._held_len <= SPECULATE_LIMIT and _could_be(s, kind):
                return True
        return False

    def end(self, out: list[OutputEvent]) -> None:
        """The value is complete."""
        if self._mode == _STREAM:
            self._calls.args('"', out)
            return
        text = "".join(self._held)
        self._held = []
        self._calls.args(_converted(text, self._types), out)
        self._mode = _STREAM

    def finish(self, out: list[OutputEvent]) -> bool:
        """Close the object and end the call: dispatched (True) or reported malformed."""
        if self._count:
            self._calls.args("}", out)
        return self._calls.end(out)
