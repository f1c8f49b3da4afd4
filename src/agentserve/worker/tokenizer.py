"""The tokenizer the worker needs: text ↔ token ids, exact, special tokens kept.

The worker only needs `encode` (output policies produce text) and `decode` (raw output text goes to
the frontend's parser, markers and all, so nothing is skipped). `HFTokenizer` wraps a Hugging Face
`tokenizers` file; `ByteTokenizer` (one token per UTF-8 byte) is the last-resort fallback when no
tokenizer file is configured or embedded: exact on any text, no files, instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from tokenizers import Tokenizer as _HFTokenizer


@runtime_checkable
class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFTokenizer:
    """A `tokenizers.Tokenizer`: no special tokens added on encode, none skipped on decode."""

    def __init__(self, tokenizer: _HFTokenizer) -> None:
        self._tok = tokenizer

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        return cls(_HFTokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def to_json(self) -> str:
        """The tokenizer.json text (the grammar engine builds its own tokenizer from it)."""
        return self._tok.to_str()


def tokenizer_json(tokenizer: Tokenizer) -> str | None:
    """The tokenizer.json text of a worker tokenizer (None: the byte tokenizer)."""
    return tokenizer.to_json() if isinstance(tokenizer, HFTokenizer) else None


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0–255)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return bytes(ids).decode("utf-8", errors="replace")
        except ValueError:  # ids from another tokenizer's vocabulary: not bytes
            return "".join(
                bytes([i]).decode("utf-8", errors="replace") if 0 <= i < 256 else "\ufffd" for i in ids
            )


EMBEDDED_TOKENIZER = Path(__file__).resolve().parent.parent / "data" / "tokenizer.json"


def load_tokenizer(path: str | Path | None = None, model_path: str | Path | None = None) -> Tokenizer:
    """`path` (a tokenizer.json), else `model_path`/tokenizer.json, else the embedded default
    (`agentserve/data/tokenizer.json`), else bytes."""
    if path is not None:
        return HFTokenizer.from_file(path)
    if model_path is not None:
        candidate = Path(model_path)
        candidate = candidate / "tokenizer.json" if candidate.is_dir() else candidate
        if candidate.is_file():
            return HFTokenizer.from_file(candidate)
    if EMBEDDED_TOKENIZER.is_file():
        return HFTokenizer.from_file(EMBEDDED_TOKENIZER)
    return ByteTokenizer()


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int], max_window: int = 32) -> list[str]:
    """The text each token adds when streamed; the pieces join to `decode(ids)` exactly.

    Decoding token by token breaks on tokens that carry part of a UTF-8 character or whose text
    depends on their neighbours, so a token's text is the difference between decoding a short
    window with and without it (the window starts one emitted token back, for context). A
    difference is emitted only where it agrees with the whole decoded text; a token that completes
    nothing yet gets "" and its text comes with a later token. Pieces are cut from the whole text,
    so joining them gives it back by construction.
    """
    full = tokenizer.decode(ids)
    pieces: list[str] = []
    prefix = read = 0  # window start, and end of the tokens already turned into text
    prefix_text = ""
    emitted = 0
    for i in range(len(ids)):
        if i + 1 - prefix > max_window:  # no agreement for too long: the rest comes at the end
            pieces.append("")
            continue
        delta = tokenizer.decode(ids[prefix : i + 1])[len(prefix_text) :]
        if delta and full.startswith(delta, emitted):
            pieces.append(delta)
            emitted += len(delta)
            prefix, read = read, i + 1
            prefix_text = tokenizer.decode(ids[prefix:read])
        else:
            pieces.append("")
    if pieces and emitted < len(full):
        pieces[-1] += full[emitted:]
    return pieces
