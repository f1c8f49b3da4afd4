"""OpenAI's strict-mode schema rules (pure): what a `strict: true` function's `parameters` or a strict
`json_schema` output format must satisfy before OpenAI accepts it.

OpenAI answers a schema that breaks them with a 400 before generating, naming the place as
`In context=('properties', 'a'), …` (the path of keys from the schema's root). The rules, from
OpenAI's Structured Outputs guide ("Supported schemas"):
- the root is an object (not `anyOf`);
- every object sets `additionalProperties: false` and lists every property in `required`
  (optional fields are nullable types instead);
- only supported keywords: composition beyond `anyOf` (`allOf`, `not`, `if`/`then`/`else`,
  `dependent*`), `default`, and the object/array keywords `patternProperties`,
  `unevaluatedProperties`, `propertyNames`, `min/maxProperties`, `unevaluatedItems`, `contains`,
  `min/maxContains`, `uniqueItems` are refused; a `format` must be one of the supported ones;
  `$ref` points inside the schema;
- limits: 10 levels of nesting, 5000 object properties, 1000 enum values, 120,000 characters of
  property names, definition names, enum and const values (an enum of more than 250 values:
  15,000 characters).

These are OpenAI's API rules, checked on the request; whether a schema can be enforced at all is
llguidance's verdict (`constraints.engine.schema_error`), checked after.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentserve.api.errors import InvalidRequestError

MAX_NESTING = 10
MAX_PROPERTIES = 5000
MAX_ENUM_VALUES = 1000
MAX_STRING_CHARS = 120_000
LARGE_ENUM = 250
LARGE_ENUM_CHARS = 15_000

UNSUPPORTED = frozenset(
    {
        "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "default",
        "patternProperties", "unevaluatedProperties", "propertyNames", "minProperties", "maxProperties",
        "unevaluatedItems", "contains", "minContains", "maxContains", "uniqueItems",
    }
)  # fmt: skip
FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")


class StrictSchemaError(ValueError):
    """A rule broken, in OpenAI's words (without the `Invalid schema for …:` prefix)."""


@dataclass(slots=True)
class _Totals:
    properties: int = 0
    enum_values: int = 0
    chars: int = 0


def check_strict(schema: Mapping[str, Any]) -> None:
    """Raises StrictSchemaError when `schema` breaks a strict-mode rule."""
    kind = schema.get("type")
    if "anyOf" in schema or kind != "object":
        got = "anyOf" if "anyOf" in schema and kind is None else kind
        raise StrictSchemaError(f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{got}\"'.")
    totals = _Totals()
    _check(schema, (), 1, totals)
    if totals.properties > MAX_PROPERTIES:
        raise StrictSchemaError(f"{totals.properties} object properties exceeds limit of {MAX_PROPERTIES}.")
    if totals.enum_values > MAX_ENUM_VALUES:
        raise StrictSchemaError(f"{totals.enum_values} enum values exceeds limit of {MAX_ENUM_VALUES}.")
    if totals.chars > MAX_STRING_CHARS:
        raise StrictSchemaError(
            f"Total string length of property names, definition names, enum values and const values "
            f"({totals.chars}) exceeds limit of {MAX_STRING_CHARS}."
        )


def check_strict_function(schema: Mapping[str, Any] | None, name: str, param: str) -> None:
    """A strict function's parameters: OpenAI's 400 (`invalid_function_parameters`) naming them."""
    _refuse_unless_strict(schema, f"function '{name}'", param, code="invalid_function_parameters")


def check_strict_format(schema: Mapping[str, Any] | None, name: str | None, param: str) -> None:
    """A strict `json_schema` output format: OpenAI's 400 naming the format."""
    _refuse_unless_strict(schema, f"response_format '{name or ''}'", param)


def _refuse_unless_strict(
    schema: Mapping[str, Any] | None, what: str, param: str, *, code: str | None = None
) -> None:
    """OpenAI's 400 for a schema its strict mode would refuse, naming `what` it belongs to."""
    if schema is None:
        return
    try:
        check_strict(schema)
    except StrictSchemaError as exc:
        raise InvalidRequestError(f"Invalid schema for {what}: {exc}", param=param, code=code) from None


def _context(path: Sequence[str]) -> str:
    return f"In context={tuple(path)!r}, "


def _check(node: Any, path: tuple[str, ...], depth: int, totals: _Totals) -> None:
    if not isinstance(node, Mapping):
        return  # a boolean schema or a non-schema value: the JSON Schema check's business
    for key in node:
        if key in UNSUPPORTED:
            raise StrictSchemaError(f"{_context(path)}'{key}' is not permitted.")
    fmt = node.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise StrictSchemaError(f"{_context(path)}'format' {fmt!r} is not supported.")
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise StrictSchemaError(f"{_context(path)}'$ref' must point inside the schema (got {ref!r}).")
    _count_values(node, path, totals)
    kinds = node.get("type")
    is_object = kinds == "object" or (isinstance(kinds, list) and "object" in kinds) or "properties" in node
    if is_object:
        if depth > MAX_NESTING:  # levels of objects, the root the first
            raise StrictSchemaError(f"{depth} levels of nesting exceeds limit of {MAX_NESTING}.")
        _check_object(node, path)
    for name in _SUBSCHEMA_MAPS:
        children = node.get(name)
        if isinstance(children, Mapping):
            if name == "properties":
                totals.properties += len(children)
            for key, child in children.items():
                totals.chars += len(str(key))
                # A property is one level deeper; a definition starts its own nesting.
                _check(child, (*path, name, str(key)), depth + 1 if name == "properties" else 1, totals)
    items = node.get("items")
    if isinstance(items, Mapping):
        _check(items, (*path, "items"), depth + 1, totals)
    for i, child in _variants(node):
        _check(child, (*path, "anyOf", str(i)), depth, totals)


def _variants(node: Mapping[str, Any]) -> Iterator[tuple[int, Any]]:
    variants = node.get("anyOf")
    if isinstance(variants, list):
        yield from enumerate(variants)


def _check_object(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
    if node.get("additionalProperties") is not False:
        raise StrictSchemaError(
            f"{_context(path)}'additionalProperties' is required to be supplied and to be false."
        )
    properties = node.get("properties") or {}
    required = node.get("required")
    keys = list(properties) if isinstance(properties, Mapping) else []
    listed = required if isinstance(required, list) else None
    missing = [k for k in keys if listed is None or k not in listed]
    if listed is None or missing:
        detail = f" Missing '{missing[0]}'." if missing else ""
        raise StrictSchemaError(
            f"{_context(path)}'required' is required to be supplied and to be an array including "
            f"every key in properties.{detail}"
        )


def _count_values(node: Mapping[str, Any], path: tuple[str, ...], totals: _Totals) -> None:
    enum = node.get("enum")
    if isinstance(enum, list):
        totals.enum_values += len(enum)
        size = sum(len(str(v)) for v in enum)
        totals.chars += size
        if len(enum) > LARGE_ENUM and size > LARGE_ENUM_CHARS:
            raise StrictSchemaError(
                f"{_context(path)}an enum of {len(enum)} values has a total string length of {size}, "
                f"over the limit of {LARGE_ENUM_CHARS} for enums of more than {LARGE_ENUM} values."
            )
    if "const" in node:
        totals.chars += len(str(node["const"]))
