"""A small byte-level BPE trained in memory: exact on any text, like the real Qwen tokenizer.

Stands in for the embedded default tokenizer (another branch) in worker tests.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
]

CORPUS = [
    "The user wrote a message. I will repeat it back.",
    'You said: "hello world, how are you today?"',
    "Let me look at the files in the current directory first.",
    '{"name": "list_files", "arguments": {"path": "."}}',
    "The weather in Paris is sunny. The weather in Berlin is cloudy.",
    "system user assistant tool response function call arguments",
] * 20


@cache
def tiny_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def write_tiny_tokenizer(directory: Path) -> Path:
    path = directory / "tokenizer.json"
    tiny_tokenizer().save(str(path))
    return path
