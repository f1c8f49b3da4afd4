"""Loads the hand-written corpus of raw outputs per family (tests/unit/families/corpus/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentserve.conversation import OutputEvent, ToolSpec
from agentserve.families import get_family
from agentserve.parsing import ParserOptions, sequential_call_id

CORPUS_DIR = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class Case:
    family: str
    name: str
    raw: str
    expect: list[dict[str, Any]]
    starts_in_reasoning: bool | None = None
    tools: tuple[ToolSpec, ...] = field(default=())

    @property
    def id(self) -> str:
        return f"{self.family}:{self.name}"


def load_cases() -> list[Case]:
    cases = []
    for path in sorted(CORPUS_DIR.glob("*.yaml")):
        for item in yaml.safe_load(path.read_text(encoding="utf-8")):
            tools = tuple(
                ToolSpec(t["name"], t.get("description", ""), t.get("parameters", {}))
                for t in item.get("tools", [])
            )
            cases.append(
                Case(
                    path.stem,
                    item["name"],
                    item["raw"],
                    item["expect"],
                    item.get("starts_in_reasoning"),
                    tools,
                )
            )
    return cases


def parse(case: Case, chunks: list[str]) -> list[OutputEvent]:
    family = get_family(case.family)
    starts = family.starts_in_reasoning if case.starts_in_reasoning is None else case.starts_in_reasoning
    parser = family.parser(ParserOptions(starts, case.tools, sequential_call_id))
    events: list[OutputEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.close()
    return events


def chunked(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
