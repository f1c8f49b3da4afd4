"""Server-sent event framing shared by the three stream encoders."""

from __future__ import annotations

import json
from typing import Any

# Compact, UTF-8 JSON: smaller frames and faster than ASCII escaping.
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

DONE = b"data: [DONE]\n\n"
PING_COMMENT = b": ping\n\n"  # an SSE comment: keeps proxies awake, ignored by every client


def dumps(value: Any) -> str:
    text: str = _encode(value)
    if not text.isascii():
        # Line separators some clients split on when they decode to text before framing.
        text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")
    return text


def event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {dumps(data)}\n\n".encode()


def data(payload: Any) -> bytes:
    return f"data: {dumps(payload)}\n\n".encode()
