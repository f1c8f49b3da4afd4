"""The pure half of the TensorRT-LLM engine, against event and stats dicts in the documented shapes
(reference/deploy.md §1.8–1.9: `get_kv_cache_events_async`, `get_stats_async`)."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import pytest

from agentserve.config import ConfigError, WorkerConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import AllCleared, BlockRemoved, BlockStored, SamplingParams, TokenLogprob
from agentserve.worker.engines.trtllm_mapping import (
    DEFAULT_EVENT_BUFFER_MAX_SIZE,
    LOGPROB_FLOOR,
    KvEventTranslator,
    MissingFieldError,
    cached_tokens_of,
    deep_merge,
    embedding_bias,
    finish_reason,
    llm_kwargs,
    load_extra_options,
    load_from_stats,
    make_step,
    model_vocab_size,
    sampling_kwargs,
    step_logprobs,
    token_logprobs,
)

BS = 4
TOKENS = list(range(100, 100 + 3 * BS + 2))
OURS = block_hashes(TOKENS, BS)


def block(engine_hash: int, tokens: list[int], **extra: object) -> dict[str, object]:
    return {
        "block_hash": engine_hash,
        "tokens": [{"token_id": t, "token_extra_id": 0} for t in tokens],
        "lora_id": None,
        "cache_level": 0,
        "priority": 35,
        **extra,
    }


def stored(
    event_id: int, parent: int | None, *blocks: dict[str, object], window: int = 4096
) -> dict[str, object]:
    return {
        "event_id": event_id,
        "data": {"type": "stored", "parent_hash": parent, "blocks": list(blocks)},
        "window_size": window,
        "attention_dp_rank": 0,
    }


def removed(event_id: int, *hashes: int) -> dict[str, object]:
    return {
        "event_id": event_id,
        "data": {"type": "removed", "block_hashes": list(hashes)},
        "window_size": 4096,
    }


CREATED = {
    "event_id": 0,
    "data": {"type": "created", "num_blocks_per_cache_level": [1024, 0]},
    "window_size": 4096,
}


def test_created_clears_and_stored_blocks_are_rehashed_in_our_chain() -> None:
    tr = KvEventTranslator(BS)
    assert tr.feed(CREATED) == [AllCleared(1)]
    ev = tr.feed(stored(1, None, block(9001, TOKENS[0:4]), block(9002, TOKENS[4:8])))
    assert ev == [BlockStored(2, (OURS[0], OURS[1]), None, 2 * BS)]
    # The next block names its parent by the engine's hash; ours chains to ours.
    ev = tr.feed(stored(2, 9002, block(9003, TOKENS[8:12]), block(9004, TOKENS[12:14])))
    assert ev == [BlockStored(3, (OURS[2],), OURS[1], BS)]  # the partial block is not published
    assert set(tr.snapshot().block_hashes) == set(OURS)
    # Removing the partial block is swallowed; removing full ones maps back to our hashes.
    assert tr.feed(removed(3, 9004)) == []
    assert tr.feed(removed(4, 9003, 9002)) == [BlockRemoved(4, (OURS[2], OURS[1]))]
    assert tr.snapshot().block_hashes == (OURS[0],)
    assert tr.snapshot().seq == 4
    assert tr.engine_gaps == 0


def test_json_text_events_are_accepted() -> None:
    tr = KvEventTranslator(BS)
    assert tr.feed(json.dumps(stored(1, None, block(1, TOKENS[0:4])))) == [
        BlockStored(1, (OURS[0],), None, BS)
    ]


def test_unknown_parent_is_skipped_and_its_removal_swallowed() -> None:
    tr = KvEventTranslator(BS)
    assert tr.feed(stored(5, 123456, block(77, TOKENS[4:8]))) == []
    assert tr.skipped_blocks == 1
    assert tr.feed(removed(6, 77)) == []


def test_duplicate_token_blocks_share_one_hash_until_the_last_goes() -> None:
    tr = KvEventTranslator(BS)
    assert len(tr.feed(stored(1, None, block(1, TOKENS[0:4])))) == 1
    assert tr.feed(stored(2, None, block(2, TOKENS[0:4]))) == []  # e.g. another cache salt
    assert tr.feed(removed(3, 1)) == []
    assert tr.feed(removed(4, 2)) == [BlockRemoved(2, (OURS[0],))]


def test_a_known_block_inside_a_stored_run_splits_it() -> None:
    tr = KvEventTranslator(BS)
    tr.feed(stored(1, None, block(1, TOKENS[0:4])))
    tr.feed(stored(2, None, block(10, TOKENS[0:4]), block(2, TOKENS[4:8])))
    ev = tr.feed(stored(3, 2, block(3, TOKENS[8:12])))
    assert ev == [BlockStored(3, (OURS[2],), OURS[1], BS)]


def test_lora_blocks_and_smaller_windows_are_not_published_and_tier_updates_move_blocks() -> None:
    tr = KvEventTranslator(BS)
    assert tr.feed(stored(1, None, block(1, TOKENS[0:4], lora_id=3))) == []
    assert tr.feed(stored(2, None, block(2, TOKENS[0:4]), window=4096)) != []
    assert tr.feed(stored(3, None, block(3, TOKENS[4:8]), window=128)) == []  # sliding-window layer
    update = {
        "event_id": 4,
        "data": {"type": "updated", "block_hash": 2, "cache_level": {"old_value": 0, "new_value": 1}},
        "window_size": 4096,
    }
    # A move to the secondary (host) tier is published as a stored event with medium cpu.
    assert tr.feed(update) == [BlockStored(2, (OURS[0],), None, BS, "cpu")]


def test_an_engine_event_id_gap_resyncs_from_a_clear() -> None:
    """Lost TensorRT-LLM events (its buffer overflowed): clear, then rebuild from what follows."""
    tr = KvEventTranslator(BS)
    tr.feed(stored(1, None, block(1, TOKENS[0:4])))
    out = tr.feed(stored(5, None, block(9, TOKENS[4:8])))
    assert tr.engine_gaps == 1
    assert isinstance(out[0], AllCleared)
    assert [h for e in out[1:] if isinstance(e, BlockStored) for h in e.block_hashes] == block_hashes(
        TOKENS[4:8], BS
    )
    assert tr.snapshot().block_hashes == tuple(block_hashes(TOKENS[4:8], BS))
    assert tr.feed(removed(6, 1)) == []  # a block from before the gap: already forgotten


def test_sampling_params_map_with_explicit_max_tokens_and_raw_text() -> None:
    kw = sampling_kwargs(SamplingParams(max_tokens=77, temperature=0.6, top_p=0.95, stop=("x",), seed=1))
    assert kw["max_tokens"] == 77
    assert (kw["temperature"], kw["top_p"], kw["seed"], kw["stop"]) == (0.6, 0.95, 1, ["x"])
    assert kw["skip_special_tokens"] is False and kw["detokenize"] is True
    assert "top_k" not in kw and "stop_token_ids" not in kw
    assert sampling_kwargs(SamplingParams(max_tokens=1, stop_token_ids=(5,)))["stop_token_ids"] == [5]


class FakeReason(Enum):
    LENGTH = 1


@pytest.mark.parametrize(
    ("raw", "ours"),
    [
        (None, None),
        ("not_finished", None),
        ("stop", "stop"),
        ("length", "length"),
        ("cancelled", "abort"),
        ("timeout", "error"),
        ("weird", "error"),
        (FakeReason.LENGTH, "length"),
    ],
)
def test_finish_reasons(raw: object, ours: str | None) -> None:
    assert finish_reason(raw) == ours


def test_steps_report_clamped_cached_tokens_once_and_usage_at_the_end() -> None:
    first = make_step(
        [5, 6], "ab", finished=False, raw_finish_reason=None, cached_tokens=96,
        prompt_tokens=96, output_tokens=2, first=True,
    )  # fmt: skip
    assert (first.cached_tokens, first.finish_reason, first.usage) == (95, None, None)
    last = make_step(
        [7], "c", finished=True, raw_finish_reason="stop", cached_tokens=96,
        prompt_tokens=96, output_tokens=3, first=False,
    )  # fmt: skip
    assert last.cached_tokens is None and last.finish_reason == "stop"
    assert last.usage is not None and (last.usage.output_tokens, last.usage.cached_tokens) == (3, 95)
    aborted = make_step(
        [], "", finished=True, raw_finish_reason=None, cached_tokens=0,
        prompt_tokens=10, output_tokens=0, first=False, aborted=True,
    )  # fmt: skip
    assert aborted.finish_reason == "abort"


def test_llm_kwargs_enable_reuse_and_events_and_merge_extra_options(tmp_path: Path) -> None:
    cfg = WorkerConfig(
        engine="trtllm", model_path="/models/qwen3", block_size=32, free_gpu_memory_fraction=0.8
    )
    extra_file = tmp_path / "extra.yaml"
    extra_file.write_text("kv_cache_config:\n  dtype: fp8\ncuda_graph_config:\n  enable_padding: true\n")
    kw = llm_kwargs(cfg, load_extra_options(extra_file))
    assert kw["model"] == "/models/qwen3"
    assert kw["kv_cache_config"] == {
        "enable_block_reuse": True,
        "tokens_per_block": 32,
        "free_gpu_memory_fraction": 0.8,
        "event_buffer_max_size": DEFAULT_EVENT_BUFFER_MAX_SIZE,
        "dtype": "fp8",
    }
    assert kw["cuda_graph_config"] == {"enable_padding": True}
    assert kw["max_batch_size"] == 256 and kw["enable_chunked_prefill"] is True


def test_llm_kwargs_refuse_settings_that_break_routing() -> None:
    cfg = WorkerConfig(engine="trtllm", block_size=32)
    with pytest.raises(ConfigError, match="tokens_per_block"):
        llm_kwargs(cfg, {"kv_cache_config": {"tokens_per_block": 64}})
    with pytest.raises(ConfigError, match="event_buffer_max_size"):
        llm_kwargs(cfg, {"kv_cache_config": {"event_buffer_max_size": 0}})


def test_extra_options_file_errors(tmp_path: Path) -> None:
    assert load_extra_options(None) == {}
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_extra_options(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_extra_options(tmp_path / "missing.yaml")


def test_deep_merge_keeps_unrelated_nested_keys() -> None:
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 3}, "e": 4}) == {
        "a": {"b": 3, "c": 2},
        "d": 1,
        "e": 4,
    }


def test_iteration_stats_give_kv_usage_and_queues() -> None:
    stats = {
        "iterLatencyMS": 12.5,
        "numActiveRequests": 7,
        "numQueuedRequests": 2,
        "kvCacheStats": {
            "maxNumBlocks": 30000,
            "freeNumBlocks": 29000,
            "usedNumBlocks": 1000,
            "tokensPerBlock": 32,
        },
    }
    assert load_from_stats(stats) == {
        "kv_blocks_used": 1000,
        "kv_blocks_total": 30000,
        "running": 7,
        "waiting": 2,
    }
    assert load_from_stats(json.dumps({"numActiveRequests": 1})) == {"running": 1}


def test_context_length_becomes_max_seq_len() -> None:
    assert llm_kwargs(WorkerConfig(engine="trtllm", max_seq_len=131072))["max_seq_len"] == 131072
    assert "max_seq_len" not in llm_kwargs(WorkerConfig(engine="trtllm"))  # the model's own


def test_include_stop_maps_to_include_stop_str_in_output() -> None:
    assert sampling_kwargs(SamplingParams(stop_token_ids=(5,)))["include_stop_str_in_output"] is False
    kept = sampling_kwargs(SamplingParams(stop_token_ids=(5,), include_stop=True))
    assert kept["include_stop_str_in_output"] is True and kept["stop_token_ids"] == [5]


class _Result:
    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


def test_cached_tokens_is_read_from_the_result_and_never_defaulted() -> None:
    assert cached_tokens_of(_Result(cached_tokens=96)) == 96
    with pytest.raises(MissingFieldError, match="no `cached_tokens`"):
        cached_tokens_of(_Result())  # an older GenerationResult (no such attribute)
    with pytest.raises(MissingFieldError):
        cached_tokens_of(_Result(cached_tokens=None))


def test_interleaved_attention_windows_are_not_a_gap() -> None:
    tr = KvEventTranslator(BS)
    for event_id, window in ((0, 4096), (0, 128), (1, 128), (1, 4096), (2, 4096)):
        tr.feed(
            {"event_id": event_id, "data": {"type": "removed", "block_hashes": []}, "window_size": window}
        )
    assert tr.engine_gaps == 0


def test_logprobs_map_to_tensorrt_llm_and_back() -> None:
    """`SamplingParams.logprobs` (0 reads as none in `_validate`: the sampled token alone is 1);
    `CompletionOutput.logprobs_diff` as `TokenLogprobs` (one `dict[int, Logprob]` per token, the
    sampled token among the entries; here dicts, as a postprocess worker serialises them) or bare
    floats (the older flow); alternatives by rank, the floor for a sampled token left out."""
    assert sampling_kwargs(SamplingParams(max_tokens=1, logprobs=0))["logprobs"] == 1
    assert sampling_kwargs(SamplingParams(max_tokens=1, logprobs=5))["logprobs"] == 5
    assert "logprobs" not in sampling_kwargs(SamplingParams(max_tokens=1))
    recorded = [
        {"791": {"logprob": -0.0213, "rank": 1}, "578": {"logprob": -3.96, "rank": 2}},
        {"1917": {"logprob": -1.52, "rank": 2}, "2134": {"logprob": -0.31, "rank": 1}},
        {"13": {"logprob": -0.9, "rank": 1}},  # the sampled token fell out of the top
    ]
    entries = [{int(t): v for t, v in d.items()} for d in recorded]
    got = token_logprobs([791, 1917, 11], entries, 2)
    assert got == [
        TokenLogprob(791, -0.0213, ((791, -0.0213), (578, -3.96))),
        TokenLogprob(1917, -1.52, ((2134, -0.31), (1917, -1.52))),
        TokenLogprob(11, LOGPROB_FLOOR, ((13, -0.9),)),
    ]
    assert token_logprobs([5], [{5: {"logprob": float("-inf"), "rank": 1}}], 0) == [
        TokenLogprob(5, LOGPROB_FLOOR)
    ]
    assert token_logprobs([5, 6], [-0.5, -0.25], 3) == [TokenLogprob(5, -0.5), TokenLogprob(6, -0.25)]
    with pytest.raises(MissingFieldError):
        token_logprobs([5, 6], [-0.5], 0)


def test_logit_bias_becomes_an_embedding_bias_over_the_vocabulary() -> None:
    assert model_vocab_size({"vocab_size": 151936}) == 151936
    assert model_vocab_size({"architectures": ["X"], "text_config": {"vocab_size": 262208}}) == 262208
    assert model_vocab_size({"llm_config": {"vocab_size": 92553}}) == 92553
    assert model_vocab_size({"hidden_size": 4}) is None
    assert embedding_bias([(1, -100.0), (3, 2.5)], 5) == [0.0, -100.0, 0.0, 2.5, 0.0]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        embedding_bias([(5, 1.0)], 5)
    with pytest.raises(ValueError, match="unknown"):
        embedding_bias([(1, 1.0)], None)


def test_a_steps_logprobs_are_taken_by_token_position() -> None:
    """The whole output's list (sliced at the new tokens), or the new tokens' alone; a trimmed stop
    token's trailing entry is ignored; anything else is a format change and fails loudly."""
    full = [-0.1, -0.2, -0.3, -0.4]
    assert step_logprobs([5, 6, 7], [7], full[:3], 0) == [TokenLogprob(7, -0.3)]
    assert step_logprobs([5, 6, 7], [6, 7], full, 0) == [TokenLogprob(6, -0.2), TokenLogprob(7, -0.3)]
    assert step_logprobs([5, 6, 7], [7], [-0.9], 0) == [TokenLogprob(7, -0.9)]
    with pytest.raises(MissingFieldError):
        step_logprobs([5, 6, 7], [6, 7], [-0.1], 0)
