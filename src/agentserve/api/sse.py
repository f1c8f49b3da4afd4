"""Server-sent event framing shared by the three stream encoders."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# Compact, UTF-8 JSON: smaller frames and faster than ASCII escaping.
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

DONE = b"data: [DONE]\n\n"
PING_COMMENT = b": ping\n\n"  # an SSE comment: keeps proxies awake, ignored by every client


# What `_encode` does with a str, without the encoder's Python-level dispatch (per-token path).
_encode_str: Callable[[str], str] = json.encoder.encode_basestring


def _escape_separators(text: str) -> str:
    # Line separators some clients split on when they decode to text before framing.
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\x85", "\\u0085")


def dumps(value: Any) -> str:
    text: str = _encode(value)
    return text if text.isascii() else _escape_separators(text)


def quote(text: str) -> str:
    """`dumps` of a str, two Python calls cheaper: every text delta frame has one."""
    out = _encode_str(text)
    return out if out.isascii() else _escape_separators(out)


def event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {dumps(data)}\n\n".encode()


def data(payload: Any) -> bytes:
    return f"data: {dumps(payload)}\n\n".encode()
