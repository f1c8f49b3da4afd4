"""The signing key's file format: what the operator writes is what the frontend reads."""

from __future__ import annotations

import base64
import hashlib

import pytest

from agentserve.api.signing import Signer
from agentserve.keyfile import MIN_KEY_BYTES, decode_key, encode_key, fingerprint

KEY = bytes(range(32))


def test_the_operators_text_reads_back_as_its_key() -> None:
    assert decode_key(encode_key(KEY).encode()) == (KEY, "hex")
    assert decode_key(encode_key(KEY).encode() + b"\n") == (KEY, "hex")


@pytest.mark.parametrize(
    ("text", "form"),
    [
        (KEY.hex().upper().encode(), "hex"),
        (base64.b64encode(KEY), "base64"),  # 44 characters, padded
        (base64.b64encode(KEY).rstrip(b"="), "base64"),
        (base64.urlsafe_b64encode(KEY + b"\xfb\xff"), "base64"),  # '-' and '_' in it
        (b"  " + base64.b64encode(KEY * 3)[:40] + b"\n" + base64.b64encode(KEY * 3)[40:] + b"\n", "base64"),
    ],
)
def test_text_forms_decode(text: bytes, form: str) -> None:
    key, got = decode_key(text)
    assert got == form
    assert key in (KEY, KEY + b"\xfb\xff", KEY * 3)


def test_anything_else_is_the_key_itself() -> None:
    passphrase = b"correct horse battery staple!"
    assert decode_key(passphrase + b"\n") == (passphrase, "raw")
    binary = bytes(range(200, 232))
    assert decode_key(binary) == (binary, "raw")
    # a malformed base64 padding is not base64
    assert decode_key(b"QUJDREVGR0hJSktMTU5PUFFSU1Q=x")[1] == "raw"


@pytest.mark.parametrize("text", [b"", b"  \n", b"0011223344556677", b"short", base64.b64encode(b"x" * 15)])
def test_short_keys_are_refused_after_decoding(text: bytes) -> None:
    with pytest.raises(ValueError, match=f"too short.*at least {MIN_KEY_BYTES}"):
        decode_key(text)


def test_fingerprint_is_a_prefix_of_the_keys_sha256_and_the_signers() -> None:
    assert fingerprint(KEY) == hashlib.sha256(KEY).hexdigest()[:8]
    assert Signer(KEY).fingerprint == fingerprint(KEY)
    assert Signer(KEY).fingerprint != Signer(KEY[::-1]).fingerprint
    assert KEY.hex()[:8] not in fingerprint(KEY)
