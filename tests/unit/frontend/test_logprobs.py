"""`AnswerLogprobs` through `Generation`: the answer text gets exactly its own tokens'
log-probabilities, whatever the chunking, never the reasoning's, a call's or the markers'."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st

from agentserve.conversation import OutputEvent, TextDelta, ToolSpec
from agentserve.families import get_family
from agentserve.frontend.generate import Generation
from agentserve.frontend.logprobs import AnswerLogprobs, token_text
from agentserve.parsing import ParserOptions
from agentserve.worker.constrained import grammar_engine
from agentserve.worker.engine import Step, TokenLogprob
from agentserve.worker.tokenizer import load_tokenizer, token_pieces

TOKENIZER = load_tokenizer()
LL = grammar_engine(TOKENIZER).tokenizer()
TOOLS = (ToolSpec("Read", "", {"type": "object"}),)


def token_bytes(token: int) -> bytes:
    return bytes(LL.decode_bytes([token]))


class Fed:
    """A stream whose steps the test feeds by hand."""

    def __aiter__(self) -> AsyncIterator[Step]:
        return self._none()

    async def _none(self) -> AsyncIterator[Step]:
        return
        yield

    async def aclose(self) -> None:
        return None


def answer(raw: str, cuts: list[int], family: str = "qwen3") -> tuple[str, list[int]]:
    """Feed `raw`'s tokens as steps cut at `cuts` (token i's logprob is -i); return the answer
    text and the positions of the tokens whose log-probabilities came with it."""
    ids = TOKENIZER.encode(raw)
    entries = [TokenLogprob(t, -float(i), ((t, -float(i)),)) for i, t in enumerate(ids)]
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    parser = get_family(family).parser(ParserOptions(tools=TOOLS))
    gen = Generation(Fed(), parser, prompt_tokens=1, logprobs=AnswerLogprobs(token_bytes))
    events: list[OutputEvent] = []
    pieces = token_pieces(TOKENIZER, ids)  # each token's streamed text, as the sim streams it
    for start, end in itertools.pairwise(bounds):
        piece = "".join(pieces[start:end])
        finish = "stop" if end == len(ids) else None
        events += gen.feed(Step(ids[start:end], piece, finish_reason=finish, logprobs=entries[start:end]))
    events += gen.close()
    texts = [e for e in events if isinstance(e, TextDelta)]
    got = [p for e in texts for p in e.logprobs or ()]
    for p in got:
        assert p.token == token_text(bytes(p.bytes)) and p.top[0].logprob == p.logprob
    return "".join(e.text for e in texts), [int(-p.logprob) for p in got]


def spans(raw: str) -> list[tuple[int, int]]:
    """Each token's byte range in `raw` (a token may hold part of a character)."""
    out, at = [], 0
    for token in TOKENIZER.encode(raw):
        size = len(token_bytes(token))
        out.append((at, at + size))
        at += size
    return out


THINK = "<think>\nAll done? Not yet.\n</think>\n\n"
RAW = THINK + "All done. Über-naïve ✓<|im_end|>"
CALL = (
    "<think>\nRead it.\n</think>\n\nLet me look.\n"
    '<tool_call>\n{"name": "Read", "arguments": {"path": "a"}}\n</tool_call><|im_end|>'
)


HARMONY = (
    "<|channel|>analysis<|message|>All done? Think.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>All done. Über ✓<|return|>"
)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 200), max_size=12))
def test_the_answer_gets_its_own_tokens_whatever_the_chunking(cuts: list[int]) -> None:
    for raw, text, family, after in (
        (RAW, "All done. Über-naïve ✓", "qwen3", b"</think>"),
        (CALL, "Let me look.", "qwen3", b"</think>"),
        (HARMONY, "All done. Über ✓", "gpt-oss", b"final"),
    ):
        got, positions = answer(raw, cuts, family)
        assert got.strip() == text
        # exactly the tokens lying inside the answer (the thought says "All done?" too)
        data, want = raw.encode(), text.encode()
        start = data.index(want, data.index(after))
        inside = [i for i, (a, b) in enumerate(spans(raw)) if a >= start and b <= start + len(want)]
        assert positions == inside


def test_text_the_parser_wrote_itself_costs_no_token() -> None:
    """A separator the parser inserts (gpt-oss between final messages) matches no token: it is
    skipped, and the tokens after the markers still go with the text they spell."""
    table = {1: b"Hel", 2: b"lo", 3: b"<|end|>", 4: b"<|start|>", 5: b"Wor", 6: b"ld", 7: b""}
    lp = AnswerLogprobs(table.__getitem__)
    lp.tokens(TokenLogprob(t, -float(t)) for t in (1, 2, 3, 7, 4, 5, 6))
    assert [p.logprob for p in lp.content("Hello", answer=True)] == [-1.0, -2.0]
    assert lp.content("\n\n", answer=True) == ()  # the separator
    assert [p.token for p in lp.content("World", answer=True)] == ["Wor", "ld"]
    # a token split across two pieces of text waits for the rest
    lp.tokens([TokenLogprob(5, -5.0)])
    assert lp.content("Wo", answer=True) == () and [p.token for p in lp.content("r", answer=True)] == ["Wor"]
