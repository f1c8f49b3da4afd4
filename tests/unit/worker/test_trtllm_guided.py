"""Constraints → TensorRT-LLM `GuidedDecodingParams`, checked the way TensorRT-LLM's own llguidance
backend reads them (`_torch/pyexecutor/grammar_matcher.py`, `LLGuidanceMatcherFactory`: one EOS token,
`grammar` compiled with `LLMatcher.grammar_from_lark`). The payloads are the constraints the frontend
builds for every family's named-tool request; the family's canonical call turn, stop token included,
must pass the matcher TensorRT-LLM would build, token by token."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from llguidance import LLMatcher, LLTokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "prompt"))
from prompt_cases import FAMILY_NAMES, KWARGS, TOOLS, cases

from agentserve.api.options import GenerationOptions, ResponseFormat, ToolChoice
from agentserve.config import WorkerConfig
from agentserve.constraints.build import build
from agentserve.constraints.engine import engine_for
from agentserve.constraints.spec import Constraint
from agentserve.families import get_family
from agentserve.families.grammar import Markers
from agentserve.frontend.plan import engine_stops
from agentserve.prompt.tokenizer import embedded_tokenizer
from agentserve.worker.engines.trtllm_mapping import (
    GuidedDecodingUnavailable,
    grammar_with_stops,
    guided_decoding_kwargs,
    llm_kwargs,
)

TOKENIZER = embedded_tokenizer()
ENGINE = engine_for(TOKENIZER.to_json())


def trt_llguidance_matcher(guide: str, eos: int) -> LLMatcher:
    """What `LLGuidanceMatcherFactory.create` builds for an EBNF_GRAMMAR guide."""
    tokenizer = LLTokenizer(TOKENIZER.to_json(), n_vocab=TOKENIZER.vocab_size, eos_token=eos)
    matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_lark(guide))
    assert not matcher.is_error(), matcher.get_error()
    return matcher


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_each_family_named_call_maps_to_a_grammar_tensorrt_llm_accepts(name: str) -> None:
    family = get_family(name)
    assert family.grammar is not None
    call = {c.name: c for c in cases(name)}["call"]
    markers = Markers(ENGINE.specials(family.grammar.marker_strings))
    options = GenerationOptions("m", tool_choice=ToolChoice("named", "get_weather"))
    opened = family.starts_in_reasoning or bool(KWARGS.get(name, {}).get("enable_thinking"))
    constraint = build(options, TOOLS, family.grammar, markers, family=name, starts_in_reasoning=opened)
    assert constraint is not None
    stops = engine_stops(family.stop_tokens, TOKENIZER.token_id)
    guide = guided_decoding_kwargs(constraint, stops.token_ids, "llguidance")
    assert set(guide) == {"grammar"}
    # TensorRT-LLM's EOS is the tokenizer's; the family's terminator is in the grammar itself.
    matcher = trt_llguidance_matcher(guide["grammar"], eos=TOKENIZER.token_id("<|endoftext|>") or 0)
    ids = TOKENIZER.encode(call.raw)
    assert matcher.try_consume_tokens(ids) == len(ids), name
    assert matcher.is_accepting() or matcher.is_stopped()


def test_a_json_answer_maps_for_both_backends() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    family = get_family("llama3-json")  # no reasoning block: the answer is exactly the JSON value
    assert family.grammar is not None
    options = GenerationOptions("m", response_format=ResponseFormat("json_schema", schema))
    constraint = build(options, (), family.grammar, Markers(), family="llama3-json")
    assert constraint is not None and constraint.json_schema == schema
    assert guided_decoding_kwargs(constraint, (), "xgrammar") == {"json": json.dumps(schema)}
    assert set(guided_decoding_kwargs(constraint, (), "llguidance")) == {"grammar"}


def test_what_cannot_be_enforced_is_refused() -> None:
    grammar_only = Constraint('start: "x"\n')
    with pytest.raises(GuidedDecodingUnavailable, match="no guided_decoding_backend"):
        guided_decoding_kwargs(grammar_only, (), None)
    with pytest.raises(GuidedDecodingUnavailable, match="xgrammar"):
        guided_decoding_kwargs(grammar_only, (), "xgrammar")
    with pytest.raises(GuidedDecodingUnavailable, match="start rule"):
        grammar_with_stops("body: x\n", (5,))
    assert grammar_with_stops('start: "x"\n', ()) == 'start: "x"\n'


def test_the_backend_reaches_the_llm_arguments() -> None:
    assert (
        llm_kwargs(WorkerConfig(engine="trtllm", model_path="/m"))["guided_decoding_backend"] == "llguidance"
    )
    off = llm_kwargs(WorkerConfig(engine="trtllm", model_path="/m", guided_decoding_backend=None))
    assert "guided_decoding_backend" not in off
    extra = {"guided_decoding_backend": "xgrammar"}
    assert (
        llm_kwargs(WorkerConfig(engine="trtllm", model_path="/m"), extra)["guided_decoding_backend"]
        == "xgrammar"
    )
