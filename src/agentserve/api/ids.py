"""Identifiers we mint, and the reversible mapping of tool-call ids onto Anthropic's alphabet.

Canonical call ids come from the family parser: `call_<hex>` by default, native ids for formats that
carry them (Kimi `functions.name:0`). Anthropic requires `tool_use.id` to match `[A-Za-z0-9_-]+`, and
its ids look like `toolu_…`, so the Anthropic codec maps:

    call_R  <->  toolu_R            (R in the alphabet, not starting with "_")
    other X <->  toolu__<base64url(X)>

`canonical_call_id(anthropic_tool_id(x)) == x` for every x; ids we did not mint (a client's own, or a
real Anthropic history) pass through unchanged.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets

_SAFE = re.compile(r"[A-Za-z0-9_-]+\Z")
_CALL = "call_"
_TOOLU = "toolu_"
_WRAPPED = "toolu__"


def new_id(prefix: str) -> str:
    """`prefix` + 24 hex digits: unique, unguessable, in every API's id alphabet."""
    return prefix + secrets.token_hex(12)


def is_safe_id(value: str) -> bool:
    return _SAFE.match(value) is not None


def anthropic_tool_id(call_id: str) -> str:
    rest = call_id[len(_CALL) :]
    if call_id.startswith(_CALL) and rest and not rest.startswith("_") and _SAFE.match(rest):
        return _TOOLU + rest
    return _WRAPPED + base64.urlsafe_b64encode(call_id.encode("utf-8")).rstrip(b"=").decode("ascii")


def canonical_call_id(tool_use_id: str) -> str:
    if tool_use_id.startswith(_WRAPPED):
        body = tool_use_id[len(_WRAPPED) :]
        try:
            decoded = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("utf-8")
        except (ValueError, binascii.Error, UnicodeDecodeError):
            return tool_use_id
        if decoded and anthropic_tool_id(decoded) == tool_use_id:
            return decoded
        return tool_use_id
    if tool_use_id.startswith(_TOOLU):
        rest = tool_use_id[len(_TOOLU) :]
        if rest and not rest.startswith("_"):
            return _CALL + rest
    return tool_use_id
