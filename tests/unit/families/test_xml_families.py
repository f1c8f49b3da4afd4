"""Streaming behaviour of the XML-argument families that the corpus (merged events) cannot show:
values stream before their close tag, and reported calls carry the model's raw text."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentserve.conversation import OutputEvent, ToolCallArgsDelta, ToolCallError, ToolCallStart, ToolSpec
from agentserve.families import get_family
from agentserve.parsing import OutputParser, ParserOptions, sequential_call_id
from agentserve.parsing.events import summarize

# Per family: text up to inside a string value, the rest of the call.
OPEN_VALUE = {
    "qwen3-coder": (
        "<tool_call>\n<function=write_file>\n<parameter=content>\nhello wor",
        "ld\n</parameter>\n</function>\n</tool_call>",
    ),
    "glm-4.5": (
        "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>hello wor",
        "ld</arg_value>\n</tool_call>",
    ),
    "minimax-m2": (
        '</think><minimax:tool_call>\n<invoke name="write_file">\n<parameter name="content">hello wor',
        "ld</parameter>\n</invoke>\n</minimax:tool_call>",
    ),
}
TOOLS = (ToolSpec("write_file", parameters={"properties": {"content": {"type": "string"}}}),)


def make(family: str) -> OutputParser:
    return get_family(family).parser(ParserOptions(family == "minimax-m2", TOOLS, sequential_call_id))


def args_text(events: list[OutputEvent]) -> str:
    return "".join(e.fragment for e in events if isinstance(e, ToolCallArgsDelta))


@pytest.mark.parametrize("family", sorted(OPEN_VALUE))
def test_string_value_streams_before_its_close_tag(family: str) -> None:
    head, rest = OPEN_VALUE[family]
    parser = make(family)
    events: list[OutputEvent] = []
    for ch in head:  # token by token
        events += parser.feed(ch)
    assert any(isinstance(e, ToolCallStart) and e.name == "write_file" for e in events)
    assert args_text(events) == '{"content": "hello wor'
    events += parser.feed(rest) + parser.close()
    assert args_text(events) == '{"content": "hello world"}'


def test_qwen3_coder_holds_only_a_trailing_newline() -> None:
    parser = make("qwen3-coder")
    events = parser.feed("<tool_call>\n<function=write_file>\n<parameter=content>\nline 1\n")
    assert args_text(events).endswith('"line 1')  # the newline may be the template's formatting
    events += parser.feed("line 2\n")
    assert args_text(events).endswith('"line 1\\nline 2')
    events += parser.feed("</parameter>\n</function>\n</tool_call>") + parser.close()
    assert args_text(events) == '{"content": "line 1\\nline 2"}'


@pytest.mark.parametrize(
    ("family", "raw", "reason"),
    [
        (
            "qwen3-coder",
            "<tool_call>\n<function=write_file>\n<parameter=content>\nprint(1)\n</param",
            "truncated",
        ),
        (
            "qwen3-coder",
            "<tool_call>\n<function=f>\n<parameter=a\nb>\n1\n</parameter>\n</function>",
            "malformed",
        ),
        ("glm-4.5", "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>x</arg_val", "truncated"),
        ("glm-4.5", "<tool_call>f\n<arg_key>a</arg_key>\noops\n</tool_call>", "malformed"),
        (
            "minimax-m2",
            '<minimax:tool_call>\n<invoke name="write_file">\n<parameter name="content">x</paramet',
            "truncated",
        ),
        (
            "minimax-m2",
            '<minimax:tool_call>\n<invoke name="f">\n<parameter nam="a">1</parameter>\n</invoke>',
            "malformed",
        ),
    ],
)
def test_reported_call_carries_its_raw_text(family: str, raw: str, reason: str) -> None:
    for size in (1, 3, len(raw)):
        parser = get_family(family).parser(ParserOptions(False, (), sequential_call_id))
        events: list[OutputEvent] = []
        for i in range(0, len(raw), size):
            events += parser.feed(raw[i : i + size])
        events += parser.close()
        errors = [e for e in events if isinstance(e, ToolCallError)]
        assert len(errors) == 1
        assert errors[0].reason == reason
        start = raw.index("<invoke") if family == "minimax-m2" else 0
        assert errors[0].raw == raw[start:]
        # Nothing of the reported call leaks out as text.
        assert not [e for e in events if not isinstance(e, ToolCallStart | ToolCallArgsDelta | ToolCallError)]


LONG = "k" * 300  # past the limit for a name or key: text, not a tag
OVER_LIMIT = [
    (
        "glm-4.5",
        f"<tool_call>f\n<arg_key>{LONG}</arg_key>\n<arg_value>1</arg_value>\n</tool_call>"
        "<tool_call>g\n<arg_key>a</arg_key><arg_value>2</arg_value></tool_call>",
        [{"error": "malformed", "name": "f"}, {"call": "g", "args": {"a": "2"}}],
    ),
    (
        "qwen3-coder",
        f"<tool_call>\n<function=f>\n<parameter={LONG}>\n1\n</parameter>\n</function>\n</tool_call>"
        f"<tool_call>\n<function={LONG}>x",
        [{"error": "malformed", "name": "f"}, {"text": f"<tool_call>\n<function={LONG}>x"}],
    ),
    (
        "minimax-m2",
        f'<minimax:tool_call><invoke name="f"><parameter name="{LONG}">1</parameter></invoke>'
        f'<invoke name="{LONG}"></invoke><invoke name="g"></invoke></minimax:tool_call>',
        [
            {"error": "malformed", "name": "f"},
            {"call": "g", "args": {}},
            {"text": f'<invoke name="{LONG}"></invoke>'},
        ],
    ),
]


@pytest.mark.parametrize(("family", "raw", "expect"), OVER_LIMIT, ids=[f for f, _, _ in OVER_LIMIT])
def test_names_and_keys_over_the_limit_degrade_the_same_at_any_chunking(
    family: str, raw: str, expect: list[dict[str, object]]
) -> None:
    for size in (1, 2, 3, 7, 100, len(raw)):
        parser = get_family(family).parser(ParserOptions(False, (), sequential_call_id))
        events: list[OutputEvent] = []
        for i in range(0, len(raw), size):
            events += parser.feed(raw[i : i + size])
        events += parser.close()
        assert summarize(events) == expect, size


def render(family: str, name: str, args: dict[str, object]) -> str:
    """A call written the way the family's chat template writes one (strings raw, others as JSON)."""

    def text(v: object) -> str:
        return v if isinstance(v, str) else json.dumps(v)

    if family == "qwen3-coder":
        params = "".join(f"<parameter={k}>\n{text(v)}\n</parameter>\n" for k, v in args.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    if family == "glm-4.5":
        params = "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{text(v)}</arg_value>\n" for k, v in args.items()
        )
        return f"<tool_call>{name}\n{params}</tool_call>"
    params = "".join(f'<parameter name="{k}">{text(v)}</parameter>\n' for k, v in args.items())
    return f'<minimax:tool_call>\n<invoke name="{name}">\n{params}</invoke>\n</minimax:tool_call>'


TAGS = ("</", "<parameter", "<arg_key>", "<arg_value>")  # a value holding one would be ambiguous
SCHEMA_OF = {str: "string", int: "integer", bool: "boolean", list: "array", dict: "object"}
values = st.one_of(
    st.text(max_size=40).filter(lambda s: not any(t in s for t in TAGS)),
    st.integers(-(10**12), 10**12),
    st.booleans(),
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from("abc"), st.text(max_size=5), max_size=2),
)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(OPEN_VALUE)),
    st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True), values, max_size=4),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_template_rendered_calls_parse_back_to_their_arguments(
    family: str, args: dict[str, object], cuts: list[int]
) -> None:
    raw = render(family, "tool_x", args)
    props = {k: {"type": SCHEMA_OF[type(v)]} for k, v in args.items()}
    tools = (ToolSpec("tool_x", parameters={"type": "object", "properties": props}),)
    parser = get_family(family).parser(ParserOptions(False, tools, sequential_call_id))
    points = sorted({c % (len(raw) + 1) for c in cuts})
    events: list[OutputEvent] = []
    for a, b in zip([0, *points], [*points, len(raw)], strict=True):
        events += parser.feed(raw[a:b])
    events += parser.close()
    assert summarize(events) == [{"call": "tool_x", "args": args}]
