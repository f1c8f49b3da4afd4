"""`thinking.display` values the client may send; only "omitted" changes what we answer."""

from __future__ import annotations

import pytest

from agentserve.api.anthropic import decode_messages


@pytest.mark.parametrize("display", ["summarized", "omitted", "updates"])
def test_adaptive_thinking_accepts_any_display(display: str) -> None:
    # Claude Code 2.1.330 sends "updates" (beta thinking-display-updates-2026-08-18); a 400 made it
    # retry every first request without it.
    body = {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "adaptive", "display": display},
    }
    request = decode_messages(body)
    assert request.options.reasoning.mode == "adaptive"
    assert request.options.reasoning.display == display
