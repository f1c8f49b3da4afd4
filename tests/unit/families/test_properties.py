"""Properties every family's parser must hold, checked with hypothesis:

- any chunking of the same text gives the same events (after merging adjacent deltas);
- a dispatched call's arguments equal the concatenation of its fragments and are a JSON object
  (checked by `summarize`, which also checks event order);
- arbitrary input never raises.
"""

from __future__ import annotations

import pytest
from corpus_cases import load_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentserve.conversation import OutputEvent
from agentserve.families import FAMILIES, Family
from agentserve.parsing import ParserOptions, sequential_call_id
from agentserve.parsing.events import merge_deltas, summarize

RAW_BY_FAMILY: dict[str, list[str]] = {}
for _case in load_cases():
    RAW_BY_FAMILY.setdefault(_case.family, []).append(_case.raw)


def run(family: Family, chunks: list[str], starts_in_reasoning: bool) -> list[OutputEvent]:
    parser = family.parser(ParserOptions(starts_in_reasoning, (), sequential_call_id))
    events: list[OutputEvent] = []
    for c in chunks:
        events += parser.feed(c)
    return events + parser.close()


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(text[last:p])
        last = p
    pieces.append(text[last:])
    return pieces


def fuzz_text(family: str) -> st.SearchStrategy[str]:
    """Text made of slices of the family's real outputs (so markers appear, whole and broken) and noise."""
    raws = RAW_BY_FAMILY.get(family) or ["<think>x</think>"]
    slice_ = st.tuples(st.sampled_from(raws), st.integers(0, 10_000), st.integers(0, 200)).map(
        lambda t: t[0][t[1] % (len(t[0]) + 1) :][: t[2]]
    )
    noise = st.text(alphabet=st.sampled_from(list('<>/|{}[]":,\\ \n_=abc')), max_size=12)
    return st.lists(st.one_of(slice_, noise, st.sampled_from(raws)), max_size=6).map("".join)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_any_chunking_of_corpus_outputs_gives_the_same_events(family: Family) -> None:
    raws = RAW_BY_FAMILY.get(family.name, [])
    assert raws, f"no corpus for {family.name}"

    @settings(suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(raws), st.lists(st.integers(0, 100_000), max_size=40), st.booleans())
    def check(raw: str, cuts: list[int], starts: bool) -> None:
        whole = merge_deltas(run(family, [raw], starts))
        assert merge_deltas(run(family, split(raw, cuts), starts)) == whole
        summarize(whole)

    check()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_arbitrary_input_never_raises_and_keeps_invariants(family: Family) -> None:
    @settings(suppress_health_check=[HealthCheck.too_slow])
    @given(fuzz_text(family.name), st.lists(st.integers(0, 100_000), max_size=20), st.booleans())
    def check(text: str, cuts: list[int], starts: bool) -> None:
        whole = merge_deltas(run(family, [text], starts))
        summarize(whole)  # order, indices, fragments == arguments, arguments are objects
        assert merge_deltas(run(family, split(text, cuts), starts)) == whole

    check()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_unicode_noise_never_raises(family: Family) -> None:
    @settings(suppress_health_check=[HealthCheck.too_slow])
    @given(st.text(max_size=300), st.lists(st.integers(0, 1000), max_size=10))
    def check(text: str, cuts: list[int]) -> None:
        summarize(merge_deltas(run(family, split(text, cuts), False)))

    check()


# Each family's closing markers: the end of a tool block, of a call or argument inside it, and of a
# thought. Outside a block, after some output, the model is writing them as text (issue 18).
CLOSERS: dict[str, tuple[str, ...]] = {
    "qwen3": ("</tool_call>", "</think>"),
    "qwen3-coder": ("</tool_call>", "</function>", "</parameter>", "</think>"),
    "deepseek-r1": ("<｜tool▁calls▁end｜>", "<｜tool▁call▁end｜>", "</think>"),
    "deepseek-v3.1": ("<｜tool▁calls▁end｜>", "<｜tool▁call▁end｜>", "</think>"),
    "kimi-k2": ("<|tool_calls_section_end|>", "<|tool_call_end|>", "</think>"),
    # Harmony has no text outside a message; inside a text message a header-only token is literal.
    "gpt-oss": ("<|constrain|>", "<|message|>"),
    "glm-4.5": ("</tool_call>", "</arg_key>", "</arg_value>", "</think>"),
    "minimax-m2": ("</minimax:tool_call>", "</invoke>", "</parameter>", "</think>"),
    "mistral": ("[/TOOL_CALLS]", "[/THINK]"),
    "llama3-json": ("}", "]"),
    "pythonic": (")", "]"),
    "nemotron": ("</TOOLCALL>", "</think>"),
}
_PROSE = st.text(alphabet=st.sampled_from(list("abcxyz .,!?\n")), max_size=30)


def test_every_family_lists_its_closing_markers() -> None:
    assert set(CLOSERS) == {f.name for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_closing_marker_outside_its_block_is_text(family: Family) -> None:
    @settings(suppress_health_check=[HealthCheck.too_slow])
    @given(
        _PROSE.filter(lambda s: bool(s.strip())),
        st.lists(st.sampled_from(CLOSERS[family.name]), min_size=1, max_size=3),
        _PROSE,
        st.lists(st.integers(0, 1000), max_size=10),
    )
    def check(before: str, markers: list[str], after: str, cuts: list[int]) -> None:
        text = before + "".join(m + after for m in markers)
        lead = "<|channel|>final<|message|>" if family.name == "gpt-oss" else ""
        events = merge_deltas(run(family, split(lead + text, cuts), False))
        assert summarize(events) == [{"text": text.strip()}]

    check()
