"""Generated sections of docs/kubernetes.md: the spec reference and the spec → config key table.

`python -m agentserve.operator.docs docs/kubernetes.md` rewrites the text between the
`<!-- generated:NAME -->` and `<!-- end:NAME -->` markers; a test fails when the file is stale.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from agentserve.operator.build import MAPPINGS
from agentserve.operator.crd import openapi_schema


def mapping_table() -> str:
    lines = ["| spec field | component | config key | note |", "| --- | --- | --- | --- |"]
    for row in MAPPINGS:
        spec = row.spec if row.spec.startswith("(") else f"`{row.spec}`"
        lines.append(f"| {spec} | {row.component} | `{row.key}` | {row.note} |")
    return "\n".join(lines)


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    kind = str(node.get("type", "any"))
    if kind == "array":
        return f"list of {_type(node['items'])}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type(node['additionalProperties'])}"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    return kind


def _rows(node: dict[str, Any], path: str, out: list[str]) -> None:
    for name, sub in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        default = sub.get("default")
        shown = "" if default is None or default == {} else f"`{json.dumps(default)}`"
        description = str(sub.get("description", "")).replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{here}` | {_type(sub)} | {shown} | {description} |")
        if sub.get("properties"):
            _rows(sub, here, out)
        elif sub.get("type") == "array" and sub["items"].get("properties"):
            _rows(sub["items"], f"{here}[]", out)


def spec_reference() -> str:
    lines = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    _rows(openapi_schema()["properties"]["spec"], "", lines)
    return "\n".join(lines)


SECTIONS = {"spec-reference": spec_reference, "mapping-table": mapping_table}


def update(text: str) -> str:
    for name, render in SECTIONS.items():
        pattern = re.compile(rf"(<!-- generated:{name} -->\n)(?:.*?\n)?(<!-- end:{name} -->)", re.DOTALL)
        match = pattern.search(text)
        if match is None:
            raise ValueError(f"markers for {name} not found")
        text = text[: match.end(1)] + render() + "\n" + text[match.start(2) :]
    return text


def main(argv: list[str]) -> int:
    path = Path(argv[0])
    path.write_text(update(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
