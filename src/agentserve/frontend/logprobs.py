"""Which output tokens' log-probabilities belong to the answer text (pure).

An engine reports a log-probability per output token; the APIs report them for the answer's text
only (Chat `choices[].logprobs.content`, Responses `output_text.logprobs`), not for reasoning, tool
calls or the family's markers, which the parser takes out. `AnswerLogprobs` lines the tokens up with
what the parser emits: the tokens of a step are queued before its text is parsed, and each piece of
emitted content consumes the queued tokens whose bytes spell it, in order; those spelling answer
text are returned with it. A queued token that spells no emitted content (a marker such as
`<think>` or `<tool_call>`) is dropped when the content that follows it is matched. A token whose
bytes run past the content emitted so far (the parser held part of it back) waits for the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from agentserve.conversation import TokenProb
from agentserve.worker.engine import TokenLogprob

LOOKAHEAD = 4096  # queued tokens searched for the one that starts the content (markers before it)


def token_text(raw: bytes) -> str:
    """A token's text as OpenAI shows it: its bytes decoded, a split character's bytes escaped."""
    return raw.decode("utf-8", errors="backslashreplace")


class AnswerLogprobs:
    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._queue: deque[tuple[TokenLogprob, bytes]] = deque()
        self._pending = b""  # emitted content not yet spelled by queued tokens
        self._answer = False  # the pending content is answer text

    def tokens(self, entries: Iterable[TokenLogprob]) -> None:
        """A step's tokens, before its text is parsed."""
        for entry in entries:
            self._queue.append((entry, self._token_bytes(entry.token_id)))

    def content(self, text: str, *, answer: bool) -> tuple[TokenProb, ...]:
        """Emitted content (answer text when `answer`, else reasoning or arguments): the answer
        tokens it completes."""
        if self._pending and answer != self._answer:
            self._pending = b""  # the other kind's leftover (text the parser made, not a token)
        self._answer = answer
        self._pending += text.encode()
        matched: list[TokenProb] = []
        queue = self._queue
        while queue and self._pending:
            entry, raw = queue[0]
            pending = self._pending
            if not raw:
                queue.popleft()  # a token without text spells nothing
                continue
            if pending.startswith(raw):
                queue.popleft()
                self._pending = pending[len(raw) :]
                if answer:
                    matched.append(self._prob(entry, raw))
            elif raw.startswith(pending):
                break  # the token's text goes on in content not emitted yet
            else:
                window = range(1, min(len(queue), LOOKAHEAD))
                ahead = next((i for i in window if _starts(pending, queue[i][1])), None)
                if ahead is not None:
                    for _ in range(ahead):  # markers before the content's first token
                        queue.popleft()
                    continue
                # No queued token starts the content: its head is text the parser wrote itself (gpt-oss's
                # separator between messages). Skip to where a queued token's text begins, if anywhere;
                # the tokens stay queued for the content that spells them.
                found = [
                    at
                    for at in (pending.find(queue[i][1]) for i in range(min(len(queue), LOOKAHEAD)))
                    if at > 0
                ]
                self._pending = pending[min(found) :] if found else b""
        if not queue:
            self._pending = b""  # no token will spell it: it is text the parser wrote
        return tuple(matched)

    def _prob(self, entry: TokenLogprob, raw: bytes) -> TokenProb:
        top = tuple(
            TokenProb(token_text(b), tuple(b), logprob)
            for b, logprob in ((self._token_bytes(t), lp) for t, lp in entry.top)
        )
        return TokenProb(token_text(raw), tuple(raw), entry.logprob, top)


def _starts(pending: bytes, raw: bytes) -> bool:
    return bool(raw) and (pending.startswith(raw) or raw.startswith(pending))
