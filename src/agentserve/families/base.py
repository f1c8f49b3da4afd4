"""What a model family is: everything model-specific about it, in one value."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Literal

from agentserve.families.grammar import ToolGrammar
from agentserve.parsing.stream import OutputParser, ParserOptions


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    # Builds the family's streaming output parser (the ONE owner of reasoning and tool parsing).
    make_parser: Callable[[ParserOptions], OutputParser]
    # Other names users know this format by (vLLM/SGLang/Dynamo parser names, sub-families).
    aliases: tuple[str, ...] = ()
    # Regexes searched (case-insensitively) in a model name to infer the family.
    model_patterns: tuple[str, ...] = ()
    # The usual chat template leaves the prompt inside an open reasoning block.
    starts_in_reasoning: bool = False
    # How the raw output carries reasoning: `<think>` tags, or harmony channels (analysis, final).
    # The sim writes its outputs in it; the model catalog says the family reasons from it.
    output_style: Literal["think", "harmony"] = "think"
    # The special tokens that end the model's turn, the one that ends a tool-call turn first. Every
    # engine stops on them (the frontend sends them with each request, kept in the output). Without
    # them a call turn runs past its terminator (gpt-oss's tokenizer EOS is `<|return|>`, not
    # `<|call|>`) and the model invents the tool's result. trtllm-serve's harmony path adds the same.
    stop_tokens: tuple[str, ...] = ()
    # The markers that are single tokens in the family's real tokenizers (chat roles, reasoning and
    # tool-call markers); the embedded default tokenizer is built with all of them (families/tokens.py).
    special_tokens: tuple[str, ...] = ()
    # The family's syntax as constraint grammar source (None: constrained decoding is refused with
    # a 400 for this family).
    grammar: ToolGrammar | None = None
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_compiled", tuple(re.compile(p, re.IGNORECASE) for p in self.model_patterns)
        )

    @property
    def chat_template(self) -> str:
        """The family's fallback chat template (Jinja source, `families/templates/<name>.jinja`).

        Used when a model directory has no template of its own, and as the test oracle: an assistant
        turn rendered from parsed output reproduces the model's raw output.
        """
        return fallback_template(self.name)

    def matches_model(self, model: str) -> bool:
        return any(p.search(model) for p in self._compiled)

    def parser(
        self, options: ParserOptions | None = None, *, starts_in_reasoning: bool | None = None
    ) -> OutputParser:
        options = options or ParserOptions(starts_in_reasoning=self.starts_in_reasoning)
        if starts_in_reasoning is not None and starts_in_reasoning != options.starts_in_reasoning:
            options = replace(options, starts_in_reasoning=starts_in_reasoning)
        return self.make_parser(options)


class MissingTemplateError(LookupError):
    pass


@cache
def fallback_template(name: str) -> str:
    """The fallback chat template shipped for family `name` (its Jinja source)."""
    path = resources.files("agentserve.families").joinpath("templates", f"{name}.jinja")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingTemplateError(f"family {name!r} has no fallback chat template ({name}.jinja)") from None
