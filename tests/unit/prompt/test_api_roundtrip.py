"""The round-trip law (design.md) through each API and its official SDK, for every family.

    raw model output → family parser → OutputEvents → the API's stream encoder → SSE → the official
    SDK's decoded message → sent back by a harness as history in the next request → our decoder →
    Conversation → render_prompt → the rendered assistant turn reproduces the raw output

and every prompt extends the previous prompt plus the model's output, token for token. Each family
runs a tool-using conversation (a realistic agent turn, then its canonical call / parallel / answer /
interleaved turns) through Anthropic Messages (Claude Code's history), Chat Completions (a client
that keeps `reasoning_content`, and one that drops it) and Responses (Codex, stateless). The server
owns a `CallMemory`, as the frontend will. What cannot round-trip is pinned below and in
docs/prompt.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from api_harness import ApiName, Served, Server, client_for
from corpus_cases import Case as CorpusCase
from corpus_cases import load_cases
from prompt_cases import (
    AGENT_TOOLS,
    CASES,
    FAMILY_NAMES,
    KWARGS,
    QUESTION,
    SYSTEM,
    Case,
    agent_case,
)

from agentserve.api.memory import CallMemory
from agentserve.config import ReplayPolicy
from agentserve.conversation import Message, Reasoning, ToolCall
from agentserve.families import get_family
from agentserve.prompt.drift import DriftReport, compare
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.tokenizer import embedded_tokenizer

HAS_REASONING = frozenset(FAMILY_NAMES) - {"llama3-json", "pythonic"}


@dataclass(frozen=True)
class Variant:
    """An API and how its client treats history."""

    api: ApiName
    keep_reasoning: bool = True
    memory: bool = True  # the server's call memory

    @property
    def id(self) -> str:
        drops = "" if self.keep_reasoning else "-drops-reasoning"
        return f"{self.api}{drops}{'' if self.memory else '-no-memory'}"


VARIANTS = [
    Variant("anthropic"),
    Variant("chat"),
    Variant("chat", keep_reasoning=False),
    Variant("responses"),
]


@dataclass(frozen=True)
class Session:
    server: Server
    script: list[Case]  # the model's turns, call indices numbered

    def turns(self) -> list[tuple[Case, Served, Served]]:
        """Each scripted turn with the request it answered and the request that replayed it."""
        served = self.server.served
        return [(case, served[t], served[t + 1]) for t, case in enumerate(self.script)]


def converse(
    name: str,
    variant: Variant,
    policy: ReplayPolicy = ReplayPolicy.AUTO,
    turns: list[Case] | None = None,
) -> Session:
    """Run the family's script (or `turns`) through the variant's SDK client; one request per turn,
    plus the request after the last turn (which renders it as history)."""
    server = Server(
        name,
        variant.api,
        PromptPipeline.for_family(name, replay=policy),
        CallMemory() if variant.memory else None,
        enable_thinking=KWARGS.get(name, {}).get("enable_thinking"),
    )
    options: dict[str, Any] = {} if variant.api != "chat" else {"keep_reasoning": variant.keep_reasoning}
    client = client_for(variant.api, server, SYSTEM[0].text, AGENT_TOOLS, QUESTION.text, **options)
    script: list[Case] = []
    for turn, case in enumerate(turns or [agent_case(name), *CASES[name]]):
        calls = sum(len(c.calls) for c in script)
        script.append(case.numbered(calls, kimi=name == "kimi-k2"))
        server.outputs.append(script[-1].raw)
        sent = client.send()
        assert len(sent) == len(case.calls), (turn, sent)
        if sent:
            client.results(sent, [f"result {turn}.{i}" for i in range(len(sent))])
        else:
            client.user(f"Thanks. Next question {turn}?")
    server.outputs.append(next(c for c in CASES[name] if c.name == "answer").raw)
    client.send()
    return Session(server, script)


def drift(before: Served, after: Served) -> DriftReport:
    """What the drift detector reports for `after`, given `before`'s prompt and generated tokens."""
    previous = [*before.prompt.token_ids, *before.generated]
    return compare(previous, after.prompt.token_ids, embedded_tokenizer().decode)


def assistant_in(served: Served) -> Message:
    """The last assistant turn of a request's decoded history (signatures aside)."""
    message = [m for m in served.request.conversation.messages if m.role == "assistant"][-1]
    parts = tuple(Reasoning(p.text) if isinstance(p, Reasoning) else p for p in message.parts)
    return Message("assistant", parts)


def dropped_by_client(name: str, variant: Variant, case: Case) -> bool:
    """A Chat client dropped this turn's reasoning and the call memory cannot find a turn without
    calls to put it back (it is keyed by call ids): the documented exception."""
    return not variant.keep_reasoning and name in HAS_REASONING and not case.calls


@pytest.mark.parametrize("policy", [ReplayPolicy.AUTO, ReplayPolicy.INJECT], ids=["auto", "inject"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_the_round_trip_law_through_the_sdk(name: str, variant: Variant, policy: ReplayPolicy) -> None:
    session = converse(name, variant, policy)
    for case, served, replayed in session.turns():
        where = f"{name} via {variant.id}, turn {case.name!r}"
        history = replayed.prompt.text
        if dropped_by_client(name, variant, case):
            report = drift(served, replayed)
            assert report.drifted, where
            assert_reasoning_lost(served, report)
            continue
        # The API layer lost nothing: the decoded history turn is the parsed turn, ids and bytes.
        assert assistant_in(replayed) == served.message, where
        expected = served.prompt.text + (case.replayed or case.raw)
        assert history[: len(expected)] == expected, where
        report = drift(served, replayed)
        if case.replayed is None:
            assert not report.drifted and report.index == report.previous_tokens, (where, report)
        else:  # gpt-oss: a final answer ends <|return|> when generated and <|end|> in history
            assert report.previous_tokens - report.index == 1, (where, report)
            assert report.previous_after.startswith("<|return|>") and report.prompt_after.startswith(
                "<|end|>"
            )


def assert_reasoning_lost(served: Served, report: DriftReport) -> None:
    """The pinned exception: history renders the answer without its reasoning, so the prompt stops
    extending the previous one where the model's reasoning began (at most the think opener the
    prompt itself wrote is lost with it); everything before the assistant turn is reused."""
    reasoning = next(p.text for p in served.message.parts if isinstance(p, Reasoning))
    answer = served.message.text
    assert report.index >= len(served.prompt.token_ids) - 2
    assert reasoning in report.previous_after and report.previous_after.index(reasoning) < 20
    assert reasoning not in report.prompt_after and report.prompt_after.index(answer) < 20


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_turns_whose_reasoning_a_chat_client_drops_come_back_from_the_call_memory(name: str) -> None:
    # Every turn with calls is restored whole (reasoning, order, argument bytes, our ids): each
    # request's history has every call so far answered by the memory, and nothing else.
    session = converse(name, Variant("chat", keep_reasoning=False))
    calls = 0
    for case, _, replayed in session.turns():
        calls += len(case.calls)
        assert replayed.request.restored == calls, case.name


def test_without_the_call_memory_a_flat_reasoning_field_moves_the_second_segment_to_the_front() -> None:
    # Chat carries one reasoning string per message: a turn with reasoning between its calls comes
    # back as one segment (joined by a blank line) before both calls. The server's call memory is
    # what keeps interleaved turns exact; every other turn round-trips without it.
    session = converse("qwen3", Variant("chat", memory=False))
    for case, served, replayed in session.turns():
        report = drift(served, replayed)
        if case.name != "interleaved":
            assert not report.drifted, case.name
            continue
        assert report.drifted
        old, new = report.before + report.previous_after, report.before + report.prompt_after
        start = old.rindex("<think>\nFirst read the file.")
        assert old[start:].startswith("<think>\nFirst read the file.\n</think>\n\n<tool_call>")
        assert new[start:].startswith("<think>\nFirst read the file.\n\nThen run the tests.\n</think>")
        assert len(report.before) >= start + len("<think>\nFirst read the file.")


COMPACT = Case(
    "compact",
    (ToolCall("call_@0", "bash", '{"cmd":"pytest -q"}'),),
    '<tool_call>\n{"name": "bash", "arguments": {"cmd":"pytest -q"}}\n</tool_call><|im_end|>',
)


@pytest.mark.parametrize("memory", [True, False])
def test_anthropic_arguments_in_another_spacing_need_the_call_memory(memory: bool) -> None:
    # `input` is an object on the wire: without the memory it comes back as json.dumps writes it,
    # and the prompt diverges at the first re-spaced argument.
    served, replayed = converse("qwen3", Variant("anthropic", memory=memory), turns=[COMPACT]).turns()[0][1:]
    report = drift(served, replayed)
    if memory:
        assert not report.drifted and COMPACT.raw in replayed.prompt.text
        return
    assert report.drifted
    # Cut at the token boundary at or before the added space, inside the arguments object.
    old, new = report.before + report.previous_after, report.before + report.prompt_after
    start = old.rindex('"arguments": {')
    assert old[start:].startswith('"arguments": {"cmd":"pytest -q"}}')
    assert new[start:].startswith('"arguments": {"cmd": "pytest -q"}}')
    assert start < len(report.before) <= start + len('"arguments": {"cmd":')


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_anthropic_input_objects_round_trip_without_the_memory_when_the_model_writes_json_dumps_spacing(
    name: str,
) -> None:
    # Anthropic sends `input` back as an object: re-serialised with the usual separators, which is
    # what every scripted turn here writes; the memory is only needed for other spacings.
    session = converse(name, Variant("anthropic", memory=False))
    for case, served, replayed in session.turns():
        if case.replayed is None:
            assert not drift(served, replayed).drifted, case.name


# -- every corpus output: the API path renders what the parsed turn renders -------------------------

CORPUS = load_cases()


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_every_corpus_output_renders_the_same_through_the_api_as_parsed(
    case: CorpusCase, variant: Variant
) -> None:
    # Odd outputs too (failed calls, escapes, arguments as a JSON string, stray tags): whatever the
    # template makes of the parsed turn, the turn that came back through the SDK must make the same.
    family = get_family(case.family)
    server = Server(
        case.family,
        variant.api,
        PromptPipeline.for_family(case.family),
        enable_thinking=KWARGS.get(case.family, {}).get("enable_thinking"),
        starts_in_reasoning=family.starts_in_reasoning
        if case.starts_in_reasoning is None
        else case.starts_in_reasoning,
        outputs=[case.raw, ""],
    )
    tools = case.tools or AGENT_TOOLS
    options: dict[str, Any] = {} if variant.api != "chat" else {"keep_reasoning": variant.keep_reasoning}
    client = client_for(variant.api, server, SYSTEM[0].text, tools, QUESTION.text, **options)
    sent = client.send()
    if sent:
        client.results(sent, [f"result {i}" for i in range(len(sent))])
    else:
        client.user("Next question?")
    client.send()
    served, replayed = server.served
    history = replayed.request.conversation
    messages = list(history.messages)
    at = max(i for i, m in enumerate(messages) if m.role == "assistant")
    direct = replace(history, messages=(*messages[:at], served.message, *messages[at + 1 :]))
    kwargs = {"enable_thinking": server.enable_thinking}
    expected = render_prompt(direct, server.pipeline, **kwargs).text
    assert replayed.prompt.text == expected
