"""Opaque tokens we hand to clients and must recognise when they come back.

- Thinking signatures (Anthropic `signature_delta`): an HMAC of the thinking text under a server key.
  Claude Code echoes each thinking block with its signature; `verify_thinking` tells our own blocks
  (text unchanged) from foreign or edited ones. The text itself travels in the clear, as on the
  real API with summarised thinking off.
- Sealed reasoning (Responses `encrypted_content`): the reasoning text itself, compressed and
  authenticated, so a stateless (`store: false`) client gives us back the exact text even if it drops
  the readable `content`. It is sealed, not secret: the same text is in the item's `content`.

Replicas that serve one client must share the key (`signing_key_file`; on Kubernetes the operator
mounts one Secret into every frontend pod). A random key per process is the fallback: a block from
another process or an earlier restart is then not recognised, and sealed reasoning is not restored.
The key's format and fingerprint are `agentserve.keyfile`'s.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import zlib

from agentserve.keyfile import MIN_KEY_BYTES, NEW_KEY_BYTES, fingerprint

THINKING_PREFIX = "ast1"
SEALED_PREFIX = "asr1."
_MAX_SEALED_TEXT = 4 * 1024 * 1024  # bytes of reasoning we accept back from a client


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"signing key must be at least {MIN_KEY_BYTES} bytes")
        self._key = key

    @classmethod
    def random(cls) -> Signer:
        return cls(secrets.token_bytes(NEW_KEY_BYTES))

    @property
    def fingerprint(self) -> str:
        """Replicas that share a key show the same fingerprint (the key itself is never shown)."""
        return fingerprint(self._key)

    def _mac(self, domain: bytes, payload: bytes) -> bytes:
        return hmac.new(self._key, domain + b"\0" + payload, hashlib.sha256).digest()

    def sign_thinking(self, text: str) -> str:
        return THINKING_PREFIX + _b64(self._mac(b"thinking", text.encode("utf-8"))[:24])

    def verify_thinking(self, text: str, signature: str | None) -> bool:
        if not signature or not signature.startswith(THINKING_PREFIX):
            return False
        return hmac.compare_digest(signature, self.sign_thinking(text))

    def seal_reasoning(self, text: str) -> str:
        payload = zlib.compress(text.encode("utf-8"), 6)
        return SEALED_PREFIX + _b64(payload) + "." + _b64(self._mac(b"reasoning", payload)[:18])

    def unseal_reasoning(self, token: str) -> str | None:
        """The reasoning text if `token` is one of ours and intact, else None (never raises)."""
        if not token.startswith(SEALED_PREFIX):
            return None
        body, _, mac = token[len(SEALED_PREFIX) :].rpartition(".")
        try:
            payload = _unb64(body)
            if not hmac.compare_digest(_unb64(mac), self._mac(b"reasoning", payload)[:18]):
                return None
            inflater = zlib.decompressobj()
            raw = inflater.decompress(payload, _MAX_SEALED_TEXT)
            if inflater.unconsumed_tail or not inflater.eof:
                return None
            return raw.decode("utf-8")
        except (ValueError, binascii.Error, zlib.error, UnicodeDecodeError):
            return None
