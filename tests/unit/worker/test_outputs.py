from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentserve.conversation import ReasoningDelta, TextDelta, ToolCallEnd, ToolCallStart
from agentserve.families import get_family
from agentserve.parsing import ParserOptions, sequential_call_id
from agentserve.parsing.events import merge_deltas
from agentserve.worker.engine import Hints
from agentserve.worker.outputs import (
    HARMONY,
    THINK_TAGS,
    THINK_TAGS_OPENED,
    EchoPolicy,
    OutputContext,
    ScenarioError,
    ScriptPolicy,
    context_for,
    context_from_prompt,
    raw_format_for,
)
from agentserve.worker.tokenizer import ByteTokenizer, HFTokenizer, token_pieces

CHATML = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    "<|im_start|>user\nList the files please<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_echo_is_reasoning_then_an_answer_that_the_family_parser_reads() -> None:
    raw = EchoPolicy(THINK_TAGS).respond(OutputContext(1, "What is   the weather?", ""))
    assert raw.startswith("<think>\n") and "</think>\n\n" in raw
    parser = get_family("qwen3").parser(ParserOptions(id_factory=sequential_call_id))
    merged = merge_deltas(parser.feed(raw) + parser.close())
    assert isinstance(merged[0], ReasoningDelta) and "4 words" in merged[0].text
    texts = [e.text for e in merged if isinstance(e, TextDelta)]
    assert texts == ['You said: "What is the weather?"']


def test_raw_formats_per_family() -> None:
    assert raw_format_for(get_family("gpt-oss")) is HARMONY
    assert raw_format_for(get_family("qwen3")) is THINK_TAGS
    assert raw_format_for(get_family("deepseek-r1")) is THINK_TAGS_OPENED
    assert HARMONY.render("r", "a") == (
        "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>final<|message|>a<|return|>"
    )
    assert THINK_TAGS_OPENED.render("r", "a") == "r\n</think>\n\na"


SCENARIO = {
    "rules": [
        {"turn": 1, "output": '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'},
        {"match": "(?i)no such file", "output": "It is gone."},
        {"turn": 2, "match": "a\\.txt", "output": "Found a.txt"},
    ],
    "default": "Done.",
}


def test_script_chooses_by_turn_then_regex_then_default() -> None:
    policy = ScriptPolicy.from_mapping(SCENARIO, EchoPolicy())
    assert policy.respond(OutputContext(1, "list", "list")).startswith("<tool_call>")
    assert policy.respond(OutputContext(2, "list", "a.txt b.txt")) == "Found a.txt"
    assert policy.respond(OutputContext(3, "list", "a.txt b.txt")) == "Done."
    assert policy.respond(OutputContext(5, "x", "ERROR: No such file")) == "It is gone."


def test_script_without_default_falls_back_to_echo() -> None:
    policy = ScriptPolicy.from_mapping({"rules": [{"turn": 9, "output": "x"}]}, EchoPolicy())
    assert "You said" in policy.respond(OutputContext(1, "hi", "hi"))


def test_script_files_in_yaml_and_json(tmp_path: Path) -> None:
    j = tmp_path / "s.json"
    j.write_text(json.dumps(SCENARIO))
    y = tmp_path / "s.yaml"
    y.write_text("rules:\n  - turn: 1\n    output: |-\n      line one\n      line two\n")
    assert ScriptPolicy.from_file(j, EchoPolicy()).outputs() == [r["output"] for r in SCENARIO["rules"]] + [
        "Done."
    ]
    assert ScriptPolicy.from_file(y, EchoPolicy()).respond(OutputContext()) == "line one\nline two"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "mapping"),
        ({"rules": {}}, "list"),
        ({"rules": [{"turn": 1}]}, "output"),
        ({"rules": [{"turn": 0, "output": "x"}]}, "positive"),
        ({"rules": [{"match": "(", "output": "x"}]}, "bad regex"),
        ({"rules": [{"output": "x", "when": 1}]}, "unknown"),
        ({"rules": [], "extra": 1}, "unknown"),
        ({"default": 3}, "default"),
    ],
)
def test_bad_scenarios_are_explained(data: object, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        ScriptPolicy.from_mapping(data, EchoPolicy())


def test_unreadable_scenario_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        ScriptPolicy.from_file(tmp_path / "missing.yaml", EchoPolicy())


def test_context_from_a_chatml_prompt() -> None:
    ctx = context_from_prompt(CHATML)
    assert ctx.turn == 2
    assert ctx.last_user_message == "List the files please"
    assert ctx.last_message.startswith("<tool_response>") and "a.txt" in ctx.last_message


def test_context_from_an_unknown_format_uses_the_tail() -> None:
    ctx = context_from_prompt("x" * 3000 + "hello")
    assert ctx.turn == 1 and ctx.last_user_message.endswith("hello") and len(ctx.last_message) == 2000


def test_hints_win_field_by_field() -> None:
    ctx = context_for(Hints(turn=7), CHATML)
    assert ctx == OutputContext(7, "List the files please", context_from_prompt(CHATML).last_message)
    assert context_for(Hints(3, "u", "m"), None) == OutputContext(3, "u", "m")


@given(st.text(max_size=200))
def test_token_pieces_join_to_the_exact_text(text: str) -> None:
    from tiny_tokenizer import tiny_tokenizer

    tok = HFTokenizer(tiny_tokenizer())
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    pieces = token_pieces(tok, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == text


@given(st.text(max_size=100))
def test_byte_tokenizer_is_exact(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert "".join(token_pieces(tok, ids)) == text


def test_multibyte_characters_are_not_split_across_pieces() -> None:
    tok = ByteTokenizer()
    pieces = token_pieces(tok, tok.encode("a😀b"))
    assert pieces == ["a", "", "", "", "😀", "b"]


def test_scripted_tool_call_parses_as_a_dispatched_call() -> None:
    policy = ScriptPolicy.from_mapping(SCENARIO, EchoPolicy())
    parser = get_family("qwen3").parser(ParserOptions(id_factory=sequential_call_id))
    events = parser.feed(policy.respond(OutputContext(1))) + parser.close()
    assert [type(e) for e in events if isinstance(e, ToolCallStart | ToolCallEnd)] == [
        ToolCallStart,
        ToolCallEnd,
    ]


def test_byte_tokenizer_decodes_foreign_ids_without_failing() -> None:
    assert ByteTokenizer().decode([300, 104, 105]) == "\ufffdhi"


def test_replacement_characters_in_the_text_stream_smoothly_and_exactly() -> None:
    tok = ByteTokenizer()
    text = "a\ufffdb" * 200
    pieces = token_pieces(tok, tok.encode(text))
    assert "".join(pieces) == text
    assert sum(1 for p in pieces if p) > 300  # not held back to the end


def test_token_pieces_give_up_on_smooth_streaming_without_quadratic_work() -> None:
    class Odd:
        """Decodes every window to something the whole text never contains."""

        calls = 0

        def encode(self, text: str) -> list[int]:
            return list(range(len(text)))

        def decode(self, ids: Sequence[int]) -> str:
            Odd.calls += 1
            return "whole" if len(ids) == 500 else "#" * len(ids)

    pieces = token_pieces(Odd(), list(range(500)))
    assert "".join(pieces) == "whole"
    assert Odd.calls < 100
