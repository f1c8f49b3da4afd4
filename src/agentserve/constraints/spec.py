"""A constraint: the data that travels with a request from the frontend to the engine.

The frontend builds it once per request (`constraints.build`), validated before any engine work; an
engine that chooses tokens enforces it (the sim masks with llguidance over its tokenizer,
TensorRT-LLM maps it onto its guided-decoding parameters). A request without one costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Constraint:
    """`grammar`: llguidance Lark source for the whole output (reasoning block, text, the family's
    tool-call syntax, `%json{…}` schemas, special tokens as `<name>`).

    `json_schema`: set when the whole output is exactly one JSON value of this schema (no reasoning
    block, no calls), so an engine with a plain JSON-schema path (TensorRT-LLM's
    `GuidedDecodingParams(json=…)`, which xgrammar also serves) can take it instead of the grammar.
    """

    grammar: str
    json_schema: Mapping[str, Any] | None = None
