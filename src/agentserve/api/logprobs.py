"""Token log-probabilities in the OpenAI APIs' wire shape (Chat `logprobs.content[]`, Responses
`output_text.logprobs[]` and `response.output_text.delta` `logprobs`: the same entry)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentserve.conversation import TokenProb


def token_json(p: TokenProb) -> dict[str, Any]:
    return {
        "token": p.token,
        "logprob": p.logprob,
        "bytes": list(p.bytes),
        "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)} for t in p.top],
    }


def tokens_json(probs: Iterable[TokenProb] | None) -> list[dict[str, Any]]:
    return [token_json(p) for p in probs or ()]
