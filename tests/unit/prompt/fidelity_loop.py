"""Issue 18's measurement: a scripted 10-turn tool loop per family × API, the "model" writing its own
whitespace, the client asking for reasoning. Reports per session:

- append-only: the share of turns whose prompt extends the previous prompt + output token for token;
- order kept: the share of turns that come back (decoded, call memory and exact replay applied) with
  their reasoning, text and calls in the order the model wrote them;
- thinking on: whether every request with an effort rendered the template's thinking-on prompt
  (hybrid families; gpt-oss: its `Reasoning:` level); None where the family has no switch.

The deviant whitespace is applied to the family's canonical outputs (`prompt_cases.CASES`) only where
the parser still reads the same turn (`deviate`), so what changes is formatting, never meaning.
Used by `test_exact_replay.py` (asserts) and `bench/fidelity.py` (prints the table).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from api_harness import EFFORT, ApiName, Server, client_for
from prompt_cases import AGENT_TOOLS, CASES, KWARGS, QUESTION, SYSTEM, Case, agent_case

from agentserve.api.memory import CallMemory
from agentserve.conversation import Message, Reasoning, Text, ToolCall
from agentserve.families import get_family
from agentserve.parsing import ParserOptions, sequential_call_id
from agentserve.prompt.drift import common_prefix
from agentserve.prompt.history import events_to_message
from agentserve.prompt.pipeline import PromptPipeline, render_prompt

TURNS = 10
HYBRID = frozenset(
    {"deepseek-r1", "deepseek-v3.1", "glm-4.5", "minimax-m2", "nemotron", "qwen3", "qwen3-coder"}
)


@dataclass(frozen=True)
class Variant:
    api: ApiName
    keep_reasoning: bool = True  # Chat only: pi and OpenClaw drop reasoning_content

    @property
    def name(self) -> str:
        return self.api if self.keep_reasoning else f"{self.api} (drops reasoning)"


VARIANTS = (
    Variant("anthropic"),
    Variant("chat"),
    Variant("chat", keep_reasoning=False),
    Variant("responses"),
)


@dataclass(frozen=True)
class Result:
    family: str
    variant: str
    exact_replay: bool
    append_only: int  # turns (of `turns`) whose next prompt extended prompt + output
    order_kept: int
    turns: int
    deviated: int  # turns whose raw output differed from the template's whitespace
    thinking_on: bool | None
    lost_tokens: int = 0  # previous prompt + output tokens the next prompts did not reuse, in all

    @property
    def share(self) -> float:
        return self.append_only / self.turns


def script(family: str) -> list[Case]:
    cases = {c.name: c for c in CASES[family]}
    other = "interleaved" if "interleaved" in cases else "preamble" if "preamble" in cases else "parallel"
    second = "parallel" if "parallel" in cases else "preamble"
    names = [other, "call", second, other, "call", other, second, other]
    return [agent_case(family), *(cases[n] for n in names), cases["answer"]]


# Whitespace a model may write differently from its template, at segment edges (one newline after
# `</think>` where the template has two, a space before a call, a blank line inside a think block).
_DEVIATIONS: tuple[tuple[str, str], ...] = (
    ("</think>\n\n", "</think>\n"),
    ("</think>\n", "</think>\n\n\n"),
    ("<think>\n", "<think>\n\n"),
    ("[/THINK]", "[/THINK]\n"),
    ("<tool_call>", " <tool_call>"),
    ("<｜tool▁calls▁begin｜>", "\n<｜tool▁calls▁begin｜>"),
    ("<|tool_calls_section_begin|>", " <|tool_calls_section_begin|>"),
    ("<minimax:tool_call>", " <minimax:tool_call>"),
    ("[TOOL_CALLS]", " [TOOL_CALLS]"),
    ("<TOOLCALL>", " <TOOLCALL>"),
    ("<|channel|>analysis<|message|>", "<|channel|>analysis<|message|> "),
    ("; {", ";  {"),
    ("), ", "),  "),
)


def _parse(family: str, raw: str, starts: bool) -> Message:
    parser = get_family(family).parser(ParserOptions(starts, AGENT_TOOLS, sequential_call_id))
    return events_to_message([*parser.feed(raw), *parser.close()])


def deviate(family: str, raw: str, starts: bool) -> str:
    """`raw` with each whitespace deviation that leaves the parsed turn unchanged."""
    expected = _parse(family, raw, starts)
    for old, new in _DEVIATIONS:
        if old not in raw:
            continue
        candidate = raw.replace(old, new)
        if _parse(family, candidate, starts) == expected:
            raw = candidate
    return raw


def _shape(message: Message) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for p in message.parts:
        if isinstance(p, Reasoning):
            out.append(("r", " ".join(p.text.split())))
        elif isinstance(p, Text):
            if p.text.strip():
                out.append(("t", " ".join(p.text.split())))
        elif isinstance(p, ToolCall):
            out.append(("c", p.name + json.dumps(json.loads(p.arguments), sort_keys=True)))
    return out


def _turn_in(history: tuple[Message, ...]) -> Message:
    """The last assistant run of a request's history, as one message."""
    end = max(i for i, m in enumerate(history) if m.role == "assistant")
    start = end
    while start > 0 and history[start - 1].role == "assistant":
        start -= 1
    return Message("assistant", tuple(p for m in history[start : end + 1] for p in m.parts))


def run(family: str, variant: Variant, *, exact_replay: bool = True, effort: bool = True) -> Result:
    pipeline = PromptPipeline.for_family(family)
    server = Server(
        family,
        variant.api,
        pipeline,
        CallMemory(),
        enable_thinking=None if effort else KWARGS.get(family, {}).get("enable_thinking"),
        exact_replay=exact_replay,
        trim_prefill=True,
    )
    deviated = 0

    def rewrite(raw: str, starts: bool) -> str:
        nonlocal deviated
        out = deviate(family, raw, starts)
        deviated += out != raw
        return out

    server.rewrite = rewrite
    options: dict[str, Any] = {"extra": dict(EFFORT[variant.api])} if effort else {}
    if variant.api == "chat":
        options["keep_reasoning"] = variant.keep_reasoning
    client = client_for(variant.api, server, SYSTEM[0].text, AGENT_TOOLS, QUESTION.text, **options)
    calls = 0
    for turn, case in enumerate(script(family)):
        numbered = case.numbered(calls, kimi=family == "kimi-k2")
        calls += len(case.calls)
        server.outputs.append(numbered.raw)
        sent = client.send()
        if sent:
            client.results(sent, [f"result {turn}.{i}" for i in range(len(sent))])
        else:
            client.user(f"Thanks. Next question {turn}?")
    server.rewrite = None
    server.outputs.append(next(c for c in CASES[family] if c.name == "answer").raw)
    client.send()

    served = server.served
    append_only = order = lost = 0
    for t in range(TURNS):
        before, after = served[t], served[t + 1]
        previous = [*before.prompt.token_ids, *before.generated]
        shared = common_prefix(previous, after.prompt.token_ids)
        lost += len(previous) - shared
        if shared == len(previous):
            append_only += 1
        if _shape(_turn_in(after.request.conversation.messages)) == _shape(before.message):
            order += 1
    thinking: bool | None = None
    if effort and (family in HYBRID or family == "gpt-oss"):
        thinking = all(_thinking_on(family, server, i) for i in range(len(served)))
    return Result(family, variant.name, exact_replay, append_only, order, TURNS, deviated, thinking, lost)


def _thinking_on(family: str, server: Server, i: int) -> bool:
    request = server.served[i].request
    canonical = server.canonical[i]
    if family == "gpt-oss":
        level = request.options.reasoning.level
        return level is not None and f"Reasoning: {level}" in canonical
    on = render_prompt(request.conversation, server.pipeline, enable_thinking=True).text
    return request.options.reasoning.enabled is True and canonical == on
