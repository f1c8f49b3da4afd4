"""Every family parses its hand-written corpus to the expected segments, at any chunk size."""

from __future__ import annotations

import pytest
from corpus_cases import Case, chunked, load_cases, parse

from agentserve.families import FAMILIES
from agentserve.parsing.events import merge_deltas, summarize

CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("size", [0, 1, 2, 3, 7])
def test_corpus_case(case: Case, size: int) -> None:
    chunks = [case.raw] if size == 0 else chunked(case.raw, size)
    assert summarize(parse(case, chunks)) == case.expect


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_chunking_does_not_change_events(case: Case) -> None:
    whole = merge_deltas(parse(case, [case.raw]))
    for size in (1, 2, 5, 13):
        assert merge_deltas(parse(case, chunked(case.raw, size))) == whole


def test_every_family_has_a_corpus_of_at_least_ten_cases() -> None:
    counts = {f.name: 0 for f in FAMILIES}
    for case in CASES:
        counts[case.family] += 1
    assert all(n >= 10 for n in counts.values()), counts
