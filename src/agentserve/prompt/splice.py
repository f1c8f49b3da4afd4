"""Exact replay: the previous assistant turn goes back into the prompt as the model produced it.

The chat template re-renders history from the parsed turn, with the template's whitespace. A model
that writes its own (one newline after `</think>` where the template has two, a space before a call)
then sees a prompt that rewrites its last turn, and the KV cache is lost from there, every turn. So,
per session, the frontend remembers what it sent and what came back (`Produced`) and splices:

    canonical render of request N+1  =  canonical(prompt N) + canonical(turn N) + tail
    prompt N+1 as sent               =  prompt N as sent  + turn N's own tokens  + tail

when the canonical render still starts with prompt N's canonical render (the client kept the history)
and turn N's raw output equals the template's rendering of it up to whitespace (`align`): the client's
echo means the same turn. Anything else — an edited history, reasoning the template drops on purpose,
gpt-oss's `<|return|>` that history writes as `<|end|>` — is left to the template.

Answers whose reasoning a Chat client dropped (turns without calls: the call memory finds turns by
call id) are put back first (`restore_answers`, from the session's answers), so their reasoning, and
with it the splice, survive too. What is remembered per session lives in `prompt.session_memory`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentserve.conversation import Conversation, Message, Text
from agentserve.prompt.hashing import block_hashes
from agentserve.prompt.pipeline import PromptPipeline, RenderedPrompt

_SPACE = re.compile(r"\s*")


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Produced:
    """One served turn of a session: its prompt (canonical and as sent) and the model's output."""

    canonical_length: int  # characters of the prompt as the template rendered it
    canonical_digest: bytes
    prompt_text: str  # the prompt as sent (itself possibly spliced)
    prompt_ids: tuple[int, ...]  # the prompt's own tuple (no copy; the next prompt starts with it)
    prompt_hashes: tuple[int, ...]  # its full blocks' hashes (the next prompt's start: not hashed again)
    output_ids: tuple[int, ...]
    output_text: str | None  # the model's raw output; None: decoded from its tokens when needed

    @classmethod
    def of(
        cls, canonical: str, prompt: RenderedPrompt, output_ids: Sequence[int], output_text: str | None = None
    ) -> Produced:
        return cls(
            len(canonical),
            _digest(canonical),
            prompt.text,
            prompt.token_ids,
            prompt.block_hashes,
            tuple(output_ids),
            output_text,
        )

    @property
    def size(self) -> int:
        return len(self.prompt_text) + len(self.prompt_ids) + 2 * len(self.output_ids)


def align(output: str, text: str, start: int) -> int | None:
    """Where `output` ends inside `text[start:]` if they are equal up to whitespace, else None.

    Trailing whitespace the model wrote stands for the template's whitespace at the same place."""
    j = start
    for word in output.split():
        j = _SPACE.match(text, j).end()  # type: ignore[union-attr]
        if text.startswith(word, j):
            j += len(word)
            continue
        for c in word:  # the template put whitespace inside what the model wrote as one run
            j = _SPACE.match(text, j).end()  # type: ignore[union-attr]
            if j >= len(text) or text[j] != c:
                return None
            j += 1
    if output[-1:].isspace():
        j = _SPACE.match(text, j).end()  # type: ignore[union-attr]
    return j


def splice(rendered: RenderedPrompt, previous: Produced, pipeline: PromptPipeline) -> RenderedPrompt | None:
    """`rendered` (the canonical prompt of the session's next request) with the previous prompt and
    output put back as they were sent and produced, or None when the request does not extend them."""
    text = rendered.text
    n = previous.canonical_length
    if len(text) < n or _digest(text[:n]) != previous.canonical_digest:
        return None
    ids = previous.prompt_ids
    output = previous.output_text
    if output is None:  # decoded only for a session that goes on
        output = pipeline.tokenizer.decode(previous.output_ids)
    end = align(output, text, n) if len(text) > n else None
    if end is not None:
        ids += previous.output_ids
        prefix = previous.prompt_text + output
    else:
        # A retry, or a turn that differs beyond whitespace (edited, or a token history writes
        # otherwise): prompt N as sent is still the prefix, and so is as much of the output as
        # matches up to a token boundary (gpt-oss's answer up to its `<|return|>`).
        k, chars = _partial(output, previous.output_ids, text, n, pipeline) if len(text) > n else (0, 0)
        if k:
            end = align(output[:chars], text, n)
        if k and end is not None:
            ids += previous.output_ids[:k]
            prefix = previous.prompt_text + output[:chars]
        else:
            end, prefix = n, previous.prompt_text
    tail = text[end:]
    token_ids = ids + tuple(pipeline.tokenizer.encode(tail))
    # The previous prompt's full blocks are this one's first blocks: chain on from the last.
    known = previous.prompt_hashes
    size = pipeline.block_size
    rest = block_hashes(
        token_ids[len(known) * size :], size, pipeline.hash_seed, known[-1] if known else None
    )
    return replace(rendered, text=prefix + tail, token_ids=token_ids, block_hashes=(*known, *rest))


def _partial(
    output: str, output_ids: Sequence[int], text: str, start: int, pipeline: PromptPipeline
) -> tuple[int, int]:
    """(tokens, characters) of the longest output prefix ending on a token boundary that matches
    `text[start:]` up to whitespace; (0, 0) if none."""
    matched = _matched(output, text, start)
    if not matched:
        return 0, 0
    decode = pipeline.tokenizer.decode
    lo, hi = 0, len(output_ids)  # the largest k whose text is no longer than the matched part
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(decode(output_ids[:mid])) <= matched:
            lo = mid
        else:
            hi = mid - 1
    for k in range(lo, max(lo - 8, 0), -1):  # a token cut inside a character decodes to U+FFFD
        piece = decode(output_ids[:k])
        if output.startswith(piece):
            return k, len(piece)
    return 0, 0


def _matched(output: str, text: str, start: int) -> int:
    """Characters of `output` that match `text[start:]` up to whitespace (to the last matched one)."""
    j, last, m = start, 0, len(text)
    for i, c in enumerate(output):
        if c.isspace():
            continue
        j = _SPACE.match(text, j).end()  # type: ignore[union-attr]
        if j >= m or text[j] != c:
            break
        j += 1
        last = i + 1
    return last


def splice_any(
    rendered: RenderedPrompt, candidates: Sequence[Produced], pipeline: PromptPipeline
) -> tuple[RenderedPrompt, Produced | None]:
    """`splice` with the first of a session's remembered turns that this request extends (and which)."""
    for previous in candidates:
        spliced = splice(rendered, previous, pipeline)
        if spliced is not None:
            return spliced, previous
    return rendered, None


def answer_key(message: Message) -> str:
    """What identifies an answer in a client's echo: its text, whitespace normalised."""
    return " ".join(message.text.split())


def restore_answers(answers: Mapping[str, Message], conversation: Conversation) -> Conversation:
    """`conversation` with each answer that means a remembered one (`answers`, by `answer_key`: the
    same text, its reasoning dropped) replaced by the answer as produced."""
    messages = list(conversation.messages)
    changed = False
    for i, message in enumerate(messages):
        if message.role != "assistant" or message.tool_calls:
            continue
        mine = answers.get(answer_key(message))
        if mine is None or mine == message:
            continue
        # Only an echo that is the answer's text alone (its reasoning dropped) is put back: one that
        # kept reasoning is the client's to keep as it is.
        if not all(isinstance(p, Text) for p in message.parts):
            continue
        messages[i] = mine
        changed = True
    return replace(conversation, messages=tuple(messages)) if changed else conversation


def __getattr__(name: str) -> Any:
    # The standalone memories are views of the session memory (`prompt.session_memory`), which
    # imports this module: looked up there on first use.
    if name in ("ReplayMemory", "AnswerMemory"):
        from agentserve.prompt import session_memory

        return getattr(session_memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
