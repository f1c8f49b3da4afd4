"""Exact replay (issue 18, item 4): a turn the model wrote with its own whitespace goes back into the
next prompt as it was produced, so every prompt extends the previous prompt + output token for token.

The measurement (`fidelity_loop.run`, also `bench/fidelity.py`): a scripted 10-turn tool loop with
interleaved reasoning per family × API, the model deviating from its template's whitespace, the
client asking for reasoning.
"""

from __future__ import annotations

import pytest
from fidelity_loop import VARIANTS, Variant, run
from prompt_cases import FAMILY_NAMES, QUESTION, SYSTEM

from agentserve.conversation import Conversation, Message, Reasoning, Text, ToolCall, ToolResult
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.session_memory import SessionMemory
from agentserve.prompt.splice import Produced, align, splice, splice_any


def test_align_ignores_whitespace_only() -> None:
    text = "PROMPT<think>\nR\n</think>\n\nhello world<|im_end|>\nnext"
    start = len("PROMPT")
    end = align("<think>\nR\n</think>\nhello world<|im_end|>", text, start)
    assert end is not None and text[end:] == "\nnext"
    # Trailing whitespace the model wrote covers the template's at that place.
    end = align("<think>R</think> hello world<|im_end|>\n", text, start)
    assert end is not None and text[end:] == "next"
    # The template split a run the model wrote as one word.
    assert align("helloworld", "hello world!", 0) == len("hello world")
    assert align("<think>\nR2\n</think>", text, start) is None  # not whitespace: not the same turn
    assert align("hello there", text, start) is None


def _pipeline() -> PromptPipeline:
    return PromptPipeline.for_family("qwen3")


def _decode(ids: object) -> str:
    return ""


def _conversation(*messages: Message) -> Conversation:
    return Conversation(SYSTEM, (QUESTION, *messages))


def test_splice_puts_back_the_models_own_whitespace_and_tokens() -> None:
    pipeline = _pipeline()
    first = render_prompt(_conversation(), pipeline)
    # One newline after </think> (the template writes two) and a space before the call.
    raw = (
        "<think>\nCheck it.\n</think>\n <tool_call>\n"
        '{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'
    )
    generated = pipeline.tokenizer.encode(raw)
    produced = Produced.of(first.text, first, generated, pipeline.tokenizer.decode(generated))
    turn = Message("assistant", (Reasoning("Check it."), ToolCall("call_1", "bash", '{"cmd": "ls"}')))
    result = Message("tool", (ToolResult("call_1", (Text("a.py"),), False, "bash"),))
    second = render_prompt(_conversation(turn, result), pipeline)
    previous = [*first.token_ids, *generated]
    assert list(second.token_ids[: len(previous)]) != previous  # the template rewrote the turn
    spliced = splice(second, produced, pipeline)
    assert spliced is not None
    assert list(spliced.token_ids[: len(previous)]) == previous
    end = second.text.index("<|im_end|>", len(first.text)) + len("<|im_end|>")
    assert spliced.text == first.text + raw + second.text[end:]
    assert spliced.text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert spliced.starts_in_reasoning == second.starts_in_reasoning


def test_a_retry_or_an_edited_turn_keeps_the_previous_prompt_as_sent() -> None:
    pipeline = _pipeline()
    first = render_prompt(_conversation(), pipeline)
    raw = "<think>\nx\n</think>\nyes<|im_end|>"
    generated = pipeline.tokenizer.encode(raw)
    produced = Produced.of(first.text, first, generated, raw)
    assert splice(first, produced, pipeline) == first  # a retry: the same prompt
    edited = render_prompt(
        _conversation(Message("assistant", (Text("no"),)), Message("user", (Text("?"),))), pipeline
    )
    spliced = splice(edited, produced, pipeline)
    assert spliced is not None and spliced.token_ids == edited.token_ids  # the client's turn, canonical
    other = render_prompt(Conversation(SYSTEM, (Message("user", (Text("something else"),)),)), pipeline)
    assert splice(other, produced, pipeline) is None  # another history: not this session's prefix


def test_a_turn_that_differs_beyond_whitespace_is_reused_up_to_where_it_differs() -> None:
    pipeline = _pipeline()
    first = render_prompt(_conversation(), pipeline)
    raw = "<think>\nLook.\n</think>\nParis is sunny today.<|im_end|>"
    generated = pipeline.tokenizer.encode(raw)
    produced = Produced.of(first.text, first, generated, raw)
    # The client edited the end of the answer (and it is the turn after the last query: kept whole).
    edited = render_prompt(
        _conversation(Message("assistant", (Reasoning("Look."), Text("Paris is rainy.")))), pipeline
    )
    spliced = splice(edited, produced, pipeline)
    assert spliced is not None
    shared = len(first.token_ids) + len(pipeline.tokenizer.encode("<think>\nLook.\n</think>\nParis is"))
    assert list(spliced.token_ids[:shared]) == [*first.token_ids, *generated][:shared]
    assert spliced.text.endswith("Paris is rainy.<|im_end|>\n<|im_start|>assistant\n")
    assert (
        "<think>\nLook.\n</think>\nParis is rainy." in spliced.text
    )  # the model's newline, the client's words


def test_answers_get_their_dropped_reasoning_back_only_in_their_own_session() -> None:
    memory = SessionMemory(_decode)
    produced = Message("assistant", (Reasoning("Both are known."), Text("Paris is 18C.")))
    memory.remember_answer("s1", produced)
    echoed = _conversation(Message("assistant", (Text("Paris is 18C. "),)), Message("user", (Text("ok"),)))
    assert memory.restore_answers("s1", echoed).messages[1] == produced
    assert memory.restore_answers("s2", echoed) is echoed
    kept = _conversation(Message("assistant", (Reasoning("Mine."), Text("Paris is 18C."))))
    assert memory.restore_answers("s1", kept) is kept  # a client that kept reasoning keeps its own


def test_replay_memory_is_bounded() -> None:
    pipeline = _pipeline()
    prompt = render_prompt(_conversation(), pipeline)
    memory = SessionMemory(_decode, max_sessions=2)
    for s in ("a", "b", "c"):
        memory.remember_turn(s, Produced.of(prompt.text, prompt, [1], "x"))
    assert len(memory) == 2 and memory.turns("a") == [] and len(memory.turns("c")) == 1
    small = SessionMemory(_decode, max_replay_size=10)
    small.remember_turn("a", Produced.of(prompt.text, prompt, [1], "x"))
    assert len(small) == 0  # larger than the whole budget


# What cannot be append-only by design: gpt-oss ends a final answer with `<|return|>`, which
# harmony history writes as `<|end|>` (the loop's last turn is an answer).
EXPECTED_MISSES = {"gpt-oss": 1}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_ten_turn_loop_with_deviant_whitespace_is_append_only(family: str, variant: Variant) -> None:
    result = run(family, variant, exact_replay=True)
    assert result.deviated >= 7, result  # the model really did write its own whitespace
    assert result.append_only == result.turns - EXPECTED_MISSES.get(family, 0), result
    # Where it cannot extend, only what differs is lost: gpt-oss's answer is reused up to `<|return|>`.
    assert result.lost_tokens == EXPECTED_MISSES.get(family, 0), result
    assert result.order_kept == result.turns, result
    assert result.thinking_on is not False, result


@pytest.mark.parametrize("family", ["qwen3", "deepseek-v3.1", "glm-4.5", "mistral"])
def test_without_exact_replay_the_same_loop_loses_the_prefix(family: str) -> None:
    # The measurement can fail: re-rendering from the template breaks the shared prefix every turn.
    result = run(family, Variant("chat", keep_reasoning=False), exact_replay=False)
    assert result.append_only <= 1, result


def test_a_side_request_under_the_same_session_does_not_cost_the_main_conversation() -> None:
    # Claude Code's title request shares the main agent's session id: the main conversation's next
    # turn must still splice onto its own last turn, not fall back to the template for all history.
    pipeline = _pipeline()
    memory = SessionMemory(pipeline.tokenizer.decode)
    first = render_prompt(_conversation(), pipeline)
    raw = (
        "<think>\nCheck it.\n</think>\n <tool_call>\n"
        + '{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>'
    )
    generated = pipeline.tokenizer.encode(raw)
    main = Produced.of(first.text, first, generated, raw)
    memory.remember_turn("s", main)
    side = render_prompt(Conversation((Text("Write a title."),), (Message("user", (Text("hi"),)),)), pipeline)
    side_prompt, extends = splice_any(side, memory.turns("s"), pipeline)
    assert extends is None and side_prompt is side
    memory.remember_turn("s", Produced.of(side.text, side, [1, 2], "Title<|im_end|>"), extends)
    turn = Message("assistant", (Reasoning("Check it."), ToolCall("call_1", "bash", '{"cmd": "ls"}')))
    result = Message("tool", (ToolResult("call_1", (Text("a.py"),), False, "bash"),))
    second = render_prompt(_conversation(turn, result), pipeline)
    spliced, extends = splice_any(second, memory.turns("s"), pipeline)
    assert extends is main
    previous = [*first.token_ids, *generated]
    assert list(spliced.token_ids[: len(previous)]) == previous
    memory.remember_turn("s", Produced.of(second.text, spliced, [3], "x"), extends)
    assert [p.prompt_text for p in memory.turns("s")] == [spliced.text, side.text]  # main replaced
    for i in range(6):  # a few conversations per session at most
        memory.remember_turn("s", Produced.of(str(i), side, [4], "y"))
    assert len(memory.turns("s")) == 4
