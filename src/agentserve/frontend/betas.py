"""`anthropic-beta` flags: accepted whatever they are, and each unfamiliar one logged once.

Claude Code sends many betas (and new ones with each release); the real API ignores the ones a
model does not support, and so do we. Logging each new name once (bounded) shows what clients ask
for without a log line per request.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

log = logging.getLogger("agentserve.frontend")

# Seen from Claude Code and its SDK; nothing in them changes what we serve.
KNOWN_BETAS = frozenset(
    {
        "claude-code-20250219",
        "interleaved-thinking-2025-05-14",
        "fine-grained-tool-streaming-2025-05-14",
        "context-1m-2025-08-07",
        "context-management-2025-06-27",
        "effort-2025-11-24",
        "oauth-2025-04-20",
        "prompt-caching-2024-07-31",
        "token-counting-2024-11-01",
        "output-128k-2025-02-19",
        "redact-thinking-2026-02-12",
        "structured-outputs-2025-12-15",
        "advanced-tool-use-2025-11-20",
        "mid-conversation-system-2026-04-07",
        "thinking-token-count-2026-05-13",
        "prompt-caching-scope-2026-01-05",
    }
)
MAX_LOGGED = 256


class BetaLog:
    def __init__(self) -> None:
        self.seen: set[str] = set()

    def note(self, values: Iterable[str]) -> list[str]:
        """Record the betas of one request; returns the ones logged now (new and unfamiliar)."""
        new: list[str] = []
        for value in values:
            for raw in value.split(","):
                name = raw.strip()[:128]
                if not name or name in KNOWN_BETAS or name in self.seen or len(self.seen) >= MAX_LOGGED:
                    continue
                self.seen.add(name)
                new.append(name)
        if new:
            log.info("anthropic-beta not recognised (accepted, no effect): %s", ", ".join(new))
        return new
