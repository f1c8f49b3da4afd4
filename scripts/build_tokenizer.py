#!/usr/bin/env python3
"""Build the embedded default tokenizer: `src/agentserve/data/tokenizer.json`.

A small BPE trained with Hugging Face `tokenizers` on this repository's own text (sources, chat
templates, docs), with every model family's chat and tool markers (`Family.special_tokens`) as special tokens, so each marker
is one token as in the real models. Characters outside the learnt alphabet fall back to one token per
UTF-8 byte (`<0x00>`…`<0xFF>`, as Llama 2 and Mistral do), so any text encodes and decodes exactly;
the vocabulary is small so the file stays well under 1 MB. Run from the repository root after adding
a family's markers:

    python scripts/build_tokenizer.py

The output is committed; building twice from the same tree gives the same file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
OUTPUT = ROOT / "src" / "agentserve" / "data" / "tokenizer.json"
VOCAB_SIZE = 6000
# Pre-tokenization: a run of non-space characters with at most one leading space, or one whitespace
# character. Every newline ends a pre-token, so a prompt that ends in "\n\n" (Llama 3 headers)
# tokenizes the same as that prompt with text after it (prefix caching needs that).
# Why so plain: this tokenizer is the default for every request, and tokenizing is nearly all of a
# cold prompt's cost. The GPT-2-style split (letters, digit runs, punctuation runs, lookahead) plus a
# byte-level character map costs `tokenizers` about 0.8 µs per token; this split with byte fallback
# about 0.4 µs (bench/prompt.py compares both in one run).
SPLIT = r" ?\S+|\s"
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
TRAINING_GLOBS = ("src/**/*.py", "src/**/*.jinja", "docs/**/*.md", "README.md", "bench/**/*.py")

def special_tokens() -> list[str]:
    """Every family's special tokens (`Family.special_tokens`), in registry order, once each."""
    from agentserve.families import FAMILIES

    seen: dict[str, None] = {}
    for family in FAMILIES:
        for token in family.special_tokens:
            seen.setdefault(token, None)
    return list(seen)


def training_files(root: Path) -> list[Path]:
    files = {p for pattern in TRAINING_GLOBS for p in root.glob(pattern) if p.is_file()}
    return sorted(files)


def build(root: Path, vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(SPLIT), behavior="isolated")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(BYTE_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=special_tokens(),
    )
    texts = [p.read_text(encoding="utf-8") for p in training_files(root)]
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return with_byte_fallback(tokenizer)


def with_byte_fallback(tokenizer: Tokenizer) -> Tokenizer:
    """Append the 256 byte tokens to the vocabulary (the trainer does not make them) and decode them."""
    data = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    clash = [t for t in vocab if re.fullmatch(r"<0x[0-9A-F]{2}>", t)]
    if clash:
        raise SystemExit(f"the training text made byte-token lookalikes: {clash}")
    next_id = 1 + max([*vocab.values(), *(t["id"] for t in data["added_tokens"])])
    for offset, token in enumerate(BYTE_TOKENS):
        vocab[token] = next_id + offset
    data["decoder"] = {
        "type": "Sequence",
        "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}],
    }
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args()
    tokenizer = build(ROOT, args.vocab_size)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(tokenizer.to_str(pretty=False) + "\n", encoding="utf-8")
    size = args.output.stat().st_size
    print(f"{args.output}: {tokenizer.get_vocab_size()} tokens, {size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
