"""Local `$ref`s of a JSON schema (`#`, `#/$defs/Point`): resolved, inlined, or kept valid when a
part of the schema is used on its own.

A tool's parameters schema is often not used whole: a grammar wraps it (`{"name": …, "arguments":
<schema>}`) or enforces each parameter apart (the XML families, pythonic calls), and a parser
types each parameter's value. Pydantic (and so `openai.pydantic_function_tool`) writes nested
models as `{"$ref": "#/$defs/Point"}` with the definitions at the root, so every such use must
follow the pointer to the root it was written against. Only JSON pointers into the same document
are handled; anything else is left as it is (the grammar engine refuses what it cannot fetch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

ROOT_DEF = "__tool_schema"  # where `standalone` keeps the whole schema, under `$defs`
DEREF_LIMIT = 16  # refs followed in a row (a cycle of refs to refs resolves to nothing)


def is_local(ref: object) -> bool:
    """A JSON pointer into the same document: `#` or `#/…` (not an anchor, not another file)."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def has_local_refs(schema: object) -> bool:
    """Whether a local `$ref` appears anywhere in `schema`."""
    if isinstance(schema, Mapping):
        if is_local(schema.get("$ref")):
            return True
        return any(has_local_refs(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_local_refs(v) for v in schema)
    return False


def pointer(root: object, ref: str) -> object | None:
    """The value `ref` (`#/a/b~1c`) points to in `root`, or None where it points nowhere."""
    node = root
    for raw in ref[1:].split("/")[1:]:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def deref(schema: Mapping[str, Any], root: object) -> Mapping[str, Any]:
    """`schema` with its own `$ref` followed (refs to refs too): the target's keywords, under the
    keywords written beside the `$ref` (2020-12 applies both). A ref that points nowhere, or a
    cycle, gives the siblings alone."""
    seen = 0
    while is_local(schema.get("$ref")) and seen < DEREF_LIMIT:
        target = pointer(root, schema["$ref"])
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        if not isinstance(target, Mapping):
            return siblings
        schema = {**target, **siblings}
        seen += 1
    if is_local(schema.get("$ref")):  # a cycle
        return {k: v for k, v in schema.items() if k != "$ref"}
    return schema


def inlined(schema: object, root: object, depth: int = 6) -> object:
    """`schema` with local refs replaced by their targets, `depth` levels of schema deep (a
    recursive schema is cut there: what a parser needs to type a value, never a grammar)."""
    if isinstance(schema, Mapping):
        if depth <= 0:
            return {}
        node = deref(schema, root)
        return {k: inlined(v, root, depth - 1) for k, v in node.items()}
    if isinstance(schema, list):
        return [inlined(v, root, depth) for v in schema]
    return schema


def rebased(schema: object, prefix: str) -> object:
    """`schema` with each local ref `#/x` rewritten to `<prefix>/x` (`#` to `<prefix>`): the same
    targets once `schema` sits at `prefix` inside another document."""
    if isinstance(schema, Mapping):
        out = {k: rebased(v, prefix) for k, v in schema.items()}
        ref = schema.get("$ref")
        if isinstance(ref, str) and is_local(ref):
            out["$ref"] = prefix + ref[1:]
        return out
    if isinstance(schema, list):
        return [rebased(v, prefix) for v in schema]
    return schema


def nested(schema: Mapping[str, Any], at: str) -> Mapping[str, Any]:
    """`schema` as it must be written at pointer `at` (`#/properties/arguments`) of a document that
    wraps it: its refs still reach its own definitions."""
    if not has_local_refs(schema):
        return schema
    out: Mapping[str, Any] = rebased(schema, at)  # type: ignore[assignment]
    return out


def standalone(part: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """`part` of `root` (a property's schema) as a schema of its own: as it is where `root` has no
    local refs, else with its refs reaching a copy of `root` kept under `$defs`."""
    if not has_local_refs(root):
        return part
    home = f"#/$defs/{ROOT_DEF}"
    out: dict[str, Any] = dict(rebased(part, home))  # type: ignore[call-overload]
    out["$defs"] = {ROOT_DEF: rebased(root, home)}
    return out


def escape_token(key: str) -> str:
    """A property name as one JSON-pointer token (`a/b` → `a~1b`)."""
    return key.replace("~", "~0").replace("/", "~1")
