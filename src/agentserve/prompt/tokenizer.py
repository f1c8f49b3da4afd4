"""Exact token ids: a model's Hugging Face `tokenizer.json`, or the embedded default.

The rendered prompt already holds every special token the template wrote (BOS included), so text is
encoded without adding special tokens, as `transformers` does for chat templates; marker strings in
the text (`<|im_start|>`, `<think>`) become their single ids.

Agent prompts repeat: each turn is the previous prompt plus a little. Hugging Face tokenizers split
text at added tokens (the chat markers) and tokenize the pieces between them independently, so the
ids of a prompt are the ids of its pieces joined; we split the same way and remember the pieces
(an LRU bounded by characters), so a turn only tokenizes what is new. Tokenizers whose added tokens
strip neighbouring spaces, match single words or match after normalization split differently; for
those every prompt is encoded whole.

The embedded default (`agentserve/data/tokenizer.json`) is a small BPE with byte fallback that this
repository builds itself (`scripts/build_tokenizer.py`): trained on the repository's own text, with
every family's markers as special tokens, and a plain whitespace pre-tokenizer that `tokenizers` runs
about twice as fast as the GPT-2-style split and byte-level map. It is what `agentserve up` and the
tests use, so nothing is downloaded; its counts are exact for itself, not for any real model.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from agentserve.prompt.template import TemplateLoadError

DEFAULT_CACHE_CHARS = 16 * 1024 * 1024


class Tokenizer:
    __slots__ = ("_added", "_cache", "_cache_chars", "_cached", "_lock", "_split", "_tok", "name")

    def __init__(self, tokenizer: HFTokenizer, name: str, cache_chars: int = DEFAULT_CACHE_CHARS) -> None:
        self._tok = tokenizer
        self.name = name
        self._split, self._added = _added_token_split(tokenizer)
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._cache_chars = cache_chars
        self._cached = 0
        self._lock = threading.Lock()  # shared across requests; encoding runs outside it

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        try:
            return cls(HFTokenizer.from_file(str(path)), str(path))
        except Exception as exc:  # tokenizers raises bare Exception for unreadable files
            raise TemplateLoadError(f"cannot load tokenizer {path}: {exc}") from exc

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> Tokenizer:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise TemplateLoadError(f"{model_dir} has no tokenizer.json (needed for exact token counts)")
        return cls.from_file(path)

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            return self._encode(text)
        # re.split with one group alternates: text, marker, text, marker, …, text
        pieces = self._split.split(text)
        known: dict[str, list[int]] = {}
        misses: dict[str, None] = {}
        with self._lock:
            for piece in pieces[::2]:
                if piece and piece not in known:
                    ids = self._cache.get(piece)
                    if ids is None:
                        misses[piece] = None
                    else:
                        known[piece] = ids
                        self._cache.move_to_end(piece)
        if misses:
            new = dict(zip(misses, self._encode_many(list(misses)), strict=True))
            known.update(new)
            with self._lock:
                self._remember(new)
        out: list[int] = []
        for i, piece in enumerate(pieces):
            if i % 2:
                out.append(self._added[piece])
            elif piece:
                out += known[piece]
        return out

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self._cached = 0

    def _encode(self, text: str) -> list[int]:
        return self._encode_many([text])[0]

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        # The fast batch path skips offset tracking, which we never use (half the time of encode()).
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def _remember(self, pieces: dict[str, list[int]]) -> None:
        for piece, ids in pieces.items():
            if piece not in self._cache:  # another thread may have added it meanwhile
                self._cached += len(piece)
            self._cache[piece] = ids
        while self._cached > self._cache_chars and self._cache:
            evicted, _ = self._cache.popitem(last=False)
            self._cached -= len(evicted)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def to_json(self) -> str:
        """The tokenizer.json text (the grammar engine builds its own tokenizer from it)."""
        return self._tok.to_str()

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


def _added_token_split(tokenizer: HFTokenizer) -> tuple[re.Pattern[str] | None, dict[str, int]]:
    """A regex splitting text exactly where the tokenizer splits it (None where we cannot match it)."""
    added = tokenizer.get_added_tokens_decoder()
    if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values()):
        return None, {}
    ids = {t.content: i for i, t in added.items()}
    # Longest first: the tokenizer matches leftmost-longest, Python's alternation leftmost-first.
    alternatives = "|".join(re.escape(c) for c in sorted(ids, key=len, reverse=True))
    return re.compile(f"({alternatives})"), ids


EMBEDDED_NAME = "agentserve-embedded"


@cache
def embedded_tokenizer() -> Tokenizer:
    """The default tokenizer shipped as package data (no download)."""
    text = resources.files("agentserve.data").joinpath("tokenizer.json").read_text(encoding="utf-8")
    return Tokenizer(HFTokenizer.from_str(text), EMBEDDED_NAME)
