"""Exact token ids: a model's Hugging Face `tokenizer.json`, or the embedded default.

The rendered prompt already holds every special token the template wrote (BOS included), so text is
encoded without adding special tokens, as `transformers` does for chat templates; marker strings in
the text (`<|im_start|>`, `<think>`) become their single ids.

The embedded default (`agentserve/data/tokenizer.json`) is a small byte-level BPE that this repository
builds itself (`scripts/build_tokenizer.py`): trained on the repository's own text, with every
family's markers as special tokens. It is what `agentserve up` and the tests use, so nothing is
downloaded; its counts are exact for itself, not for any real model.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from agentserve.prompt.template import TemplateLoadError


class Tokenizer:
    __slots__ = ("_tok", "name")

    def __init__(self, tokenizer: HFTokenizer, name: str) -> None:
        self._tok = tokenizer
        self.name = name

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
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


EMBEDDED_NAME = "agentserve-embedded"


@cache
def embedded_tokenizer() -> Tokenizer:
    """The default tokenizer shipped as package data (no download)."""
    text = resources.files("agentserve.data").joinpath("tokenizer.json").read_text(encoding="utf-8")
    return Tokenizer(HFTokenizer.from_str(text), EMBEDDED_NAME)
