"""The signing key's file format, in one place for the writer (the operator) and the reader (the frontend).

A key file (or `$AGENTSERVE_SIGNING_KEY`) holds one of, after surrounding whitespace is stripped:
- hex text (an even number of hex digits): decoded — what the operator writes, and `openssl rand -hex 32`;
- base64 text (standard or URL-safe alphabet, padding optional, line breaks allowed): decoded —
  `openssl rand -base64 32`;
- anything else: the bytes themselves (a binary file, or a passphrase that is neither of the above).
Hex is tried first (hex digits are also base64 letters). The key that results must be at least
`MIN_KEY_BYTES` long. Only its fingerprint (the first 8 hex digits of its SHA-256) is ever shown.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

MIN_KEY_BYTES = 16
NEW_KEY_BYTES = 32  # what the operator generates

_HEX = re.compile(rb"(?:[0-9a-fA-F]{2})+")
_BASE64 = re.compile(rb"[A-Za-z0-9+/]+={0,2}|[A-Za-z0-9_-]+={0,2}")


def _base64(text: bytes) -> bytes | None:
    if not _BASE64.fullmatch(text):
        return None
    body = text.rstrip(b"=")
    if len(body) % 4 == 1 or (body != text and len(text) % 4):
        return None  # no base64 has that length, or the padding is wrong
    standard = body.translate(bytes.maketrans(b"-_", b"+/"))
    try:
        return base64.b64decode(standard + b"=" * (-len(standard) % 4), validate=True)
    except binascii.Error:
        return None


def decode_key(data: bytes) -> tuple[bytes, str]:
    """The key a file holds and how it was read (`hex`, `base64` or `raw`); ValueError when too short."""
    text = data.strip()
    compact = b"".join(text.split())  # wrapped base64 (`openssl rand -base64 64`) spans lines
    key: bytes | None = None
    if _HEX.fullmatch(compact):
        key, form = bytes.fromhex(compact.decode("ascii")), "hex"
    elif (key := _base64(compact)) is not None:
        form = "base64"
    else:
        key, form = text, "raw"
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"signing key too short: {len(key)} bytes (read as {form}), need at least {MIN_KEY_BYTES} "
            "(e.g. `openssl rand -hex 32`)"
        )
    return key, form


def encode_key(key: bytes) -> str:
    """The text the operator stores: hex, so `kubectl get secret` shows what `openssl rand -hex` would."""
    return key.hex()


def fingerprint(key: bytes) -> str:
    """Safe to log and to compare across replicas: the first 8 hex digits of the key's SHA-256."""
    return hashlib.sha256(key).hexdigest()[:8]
