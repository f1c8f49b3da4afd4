"""Streaming behaviour of the mistral, llama3-json, pythonic and nemotron parsers that the corpus
(which compares whole turns) cannot see: when events come out, and which ids they carry."""

from __future__ import annotations

from agentserve.conversation import (
    OutputEvent,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)
from agentserve.families import get_family
from agentserve.parsing import OutputParser, ParserOptions, sequential_call_id


def parser(family: str) -> OutputParser:
    return get_family(family).parser(ParserOptions(id_factory=sequential_call_id))


def kinds(events: list[OutputEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


def test_mistral_keeps_the_native_call_id_and_starts_the_call_before_its_arguments() -> None:
    p = parser("mistral")
    events = p.feed('[TOOL_CALLS]read[CALL_ID]Zx81Kq02a[ARGS]{"path": "a')
    assert events[0] == ToolCallStart(0, "Zx81Kq02a", "read")
    assert isinstance(events[-1], ToolCallArgsDelta)
    assert p.feed('.txt"}')[-1] == ToolCallEnd(0, '{"path": "a.txt"}')


def test_mistral_v11_call_starts_when_the_name_ends() -> None:
    p = parser("mistral")
    assert p.feed("[TOOL_CALLS]get_weat") == []
    assert p.feed('her{"ci') == [ToolCallStart(0, "call_0", "get_weather"), ToolCallArgsDelta(0, '{"ci')]


def test_llama3_json_content_that_is_not_a_call_is_released_at_its_first_key() -> None:
    p = parser("llama3-json")
    events = p.feed('{"answer": "a long JSON answer that is still being written')
    assert events and all(isinstance(e, TextDelta) for e in events)
    assert "".join(e.text for e in events if isinstance(e, TextDelta)).startswith('{"answer":')


def test_llama3_json_call_starts_at_its_name() -> None:
    p = parser("llama3-json")
    assert p.feed('{"name": "search", "parameters": {"q": "x') == [
        ToolCallStart(0, "call_0", "search"),
        ToolCallArgsDelta(0, '{"q": "x'),
    ]


def test_pythonic_call_starts_at_its_open_paren_and_is_dispatched_at_its_close() -> None:
    p = parser("pythonic")
    assert p.feed("[get_weather") == []
    assert p.feed('(city="Par') == [ToolCallStart(0, "call_0", "get_weather")]
    assert p.feed('is"), get_time(') == [
        ToolCallArgsDelta(0, '{"city": "Paris"}'),
        ToolCallEnd(0, '{"city": "Paris"}'),
        ToolCallStart(1, "call_1", "get_time"),
    ]
    assert kinds(p.feed(")]")) == ["ToolCallArgsDelta", "ToolCallEnd"]
    assert p.close() == []


def test_pythonic_error_carries_the_model_text_of_the_call() -> None:
    p = parser("pythonic")
    events = p.feed("[f(x=open('/etc/passwd'))]") + p.close()
    error = events[-1]
    assert isinstance(error, ToolCallError) and error.reason == "malformed"
    assert error.raw == "f(x=open('/etc/passwd'))"


def test_nemotron_thinking_off_output_is_plain_text() -> None:
    p = parser("nemotron")
    events = p.feed("No reasoning here, just the answer.") + p.close()
    assert events == [TextDelta("No reasoning here, just the answer.")]


def test_content_shaped_like_a_call_is_text_where_no_call_can_be_asked_for() -> None:
    """No tools or tool_choice none (`calls_by_shape` False): a JSON answer `{"name": …,
    "parameters": …}` (Llama 3 JSON) or a list `[f(x=1)]` (pythonic) is the answer, not a call."""
    for family, answer in (
        ("llama3-json", '{"name": "Alice", "parameters": {"age": 3}}'),
        ("pythonic", "[f(x=1)]"),
    ):
        shaped = get_family(family).parser(ParserOptions(id_factory=sequential_call_id))
        assert "ToolCallStart" in kinds(shaped.feed(answer) + shaped.close())
        plain = get_family(family).parser(ParserOptions(id_factory=sequential_call_id, calls_by_shape=False))
        events = plain.feed(answer) + plain.close()
        assert "ToolCallStart" not in kinds(events)
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == answer
