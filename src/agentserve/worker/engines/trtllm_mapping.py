"""Pure mappings between agentserve and TensorRT-LLM's LLM API (no `tensorrt_llm` import here).

- `llm_kwargs`: `WorkerConfig` + the extra-options YAML → keyword arguments of `tensorrt_llm.LLM`
  (`kv_cache_config` as a dict; the engine module turns it into a `KvCacheConfig`).
- `sampling_kwargs`: our `SamplingParams` → keyword arguments of `tensorrt_llm.SamplingParams`.
- `finish_reason` / `make_step`: a streamed `RequestOutput`'s values → our `Step`.
- `KvEventTranslator`: TensorRT-LLM KV cache event dicts (`get_kv_cache_events_async`) → our
  `KvEvent`s. TensorRT-LLM names blocks by its own hashes; the router matches prompts by ours
  (`block_hashes`), so each stored block is re-hashed from its token ids, chained to its parent's
  hash in our space, and removals are mapped back through the same table.
- `load_from_stats`: an iteration-stats dict (`get_stats_async`) → KV blocks used/total and queues.
- `guided_decoding_kwargs`: a request's `Constraint` → keyword arguments of TensorRT-LLM's
  `GuidedDecodingParams` (docs/worker.md, "Constrained decoding"), for the LLM's
  `guided_decoding_backend`.
- Attention DP (`enable_attention_dp`): `attention_dp_ranks` from the LLM arguments,
  `RankedKvTranslator` (one translator, one event stream and one snapshot per rank, events routed
  by their `attention_dp_rank`), `scheduling_kwargs` (pin a request to the router's rank).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from agentserve.config import ConfigError, WorkerConfig
from agentserve.constraints.spec import Constraint
from agentserve.conversation import FinishReason, Usage
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    KvSnapshot,
    SamplingParams,
    Step,
    TokenLogprob,
    samplers_and_stops,
)
from agentserve.worker.engines.trtllm_disagg import transceiver_kwargs, transferred_tokens
from agentserve.worker.engines.trtllm_retention import PRIMARY_CACHE_LEVEL, medium_of, updated_medium

# Events buffered inside TensorRT-LLM between our polls (Dynamo's newer default).
DEFAULT_EVENT_BUFFER_MAX_SIZE = 100_000

# --------------------------------------------------------------------------------------------------
# LLM construction


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` wins; nested mappings merge key by key (as trtllm-serve merges its YAML)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_extra_options(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read extra LLM API options {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"extra LLM API options {path} must be a mapping of LLM() arguments")
    return data


def llm_kwargs(config: WorkerConfig, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": config.model_path or config.model,
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "max_batch_size": config.max_batch_size,
        "max_num_tokens": config.max_num_tokens,
        "enable_chunked_prefill": config.enable_chunked_prefill,
        "enable_iter_perf_stats": True,  # KV usage and queue depth for /metrics and the router
        "kv_cache_config": {
            "enable_block_reuse": config.enable_block_reuse,
            "tokens_per_block": config.block_size,
            "free_gpu_memory_fraction": config.free_gpu_memory_fraction,
            "event_buffer_max_size": DEFAULT_EVENT_BUFFER_MAX_SIZE,
        },
    }
    if config.gpus_per_node is not None:  # a replica spanning nodes (LLM(gpus_per_node=…))
        base["gpus_per_node"] = config.gpus_per_node
    if config.max_seq_len is not None:  # the deployment's model.contextLength
        base["max_seq_len"] = config.max_seq_len
    if config.host_cache_size:
        base["kv_cache_config"]["host_cache_size"] = config.host_cache_size  # the host (secondary) tier
    if config.guided_decoding_backend is not None:  # constrained requests (GuidedDecodingParams)
        base["guided_decoding_backend"] = config.guided_decoding_backend
    try:  # a prefill or decode worker: the cache transceiver (trtllm_disagg.py)
        base.update(transceiver_kwargs(config.role, config.max_seq_len))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    merged = deep_merge(base, extra or {})
    buffer = transferred_tokens(merged)
    if config.role != "both" and config.max_seq_len is not None and (buffer or 0) < config.max_seq_len:
        raise ConfigError(
            f"cache_transceiver_config.max_tokens_in_buffer ({buffer}) must be at least max_seq_len "
            f"({config.max_seq_len}): a smaller buffer can deadlock the workers under load"
        )
    kv = merged.get("kv_cache_config")
    if not isinstance(kv, Mapping):
        raise ConfigError("kv_cache_config must be a mapping")
    if kv.get("tokens_per_block") != config.block_size:
        raise ConfigError(
            f"kv_cache_config.tokens_per_block ({kv.get('tokens_per_block')}) must equal block_size "
            f"({config.block_size}): the router hashes prompts in blocks of that size"
        )
    if not kv.get("event_buffer_max_size"):
        raise ConfigError("kv_cache_config.event_buffer_max_size must be positive: KV events need it")
    return merged


# --------------------------------------------------------------------------------------------------
# Requests and outputs


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_tokens,  # TensorRT-LLM's default is 32: always explicit
        "ignore_eos": params.ignore_eos,
        # Raw output for the frontend's parser: keep special tokens and their exact spacing.
        "detokenize": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        # Whether a matched stop stays in token_ids/text (result.py `_handle_sequence` trims it
        # when False); the frontend asks for it with the family's end-of-turn tokens.
        "include_stop_str_in_output": params.include_stop,
    }
    kwargs.update(samplers_and_stops(params))  # TensorRT-LLM takes each under the same name
    if params.logprobs is not None:
        # `logprobs: Optional[int]`, the log-probabilities returned per output token; `_validate`
        # reads 0 as none (`self.logprobs and int(self.logprobs)`), so the sampled token alone is
        # asked for as 1.
        kwargs["logprobs"] = max(params.logprobs, 1)
    return kwargs


LOGPROB_FLOOR = -9999.0  # OpenAI's and trtllm-serve's floor for a log-probability (-inf in JSON)


def token_logprobs(token_ids: Sequence[int], logprobs: Sequence[Any], top: int) -> list[TokenLogprob]:
    """`CompletionOutput.logprobs_diff` → ours. TensorRT-LLM's generation log-probabilities are
    `TokenLogprobs = list[dict[int, Logprob]]`, one dict per output token mapping token ids (the
    sampled one among them) to `Logprob(logprob, rank)`; the alternatives are the dict's entries by
    rank (most likely first), `top` of them. A position whose dict lacks the sampled token reports
    the floor, as trtllm-serve leaves it unknown. A bare float per position (the older TRT flow)
    gives the sampled token's value and no alternatives."""
    if len(logprobs) != len(token_ids):
        raise MissingFieldError(
            f"TensorRT-LLM returned {len(logprobs)} log-probabilities for {len(token_ids)} tokens"
        )
    out: list[TokenLogprob] = []
    for token, entry in zip(token_ids, logprobs, strict=True):
        if isinstance(entry, int | float):
            out.append(TokenLogprob(token, max(float(entry), LOGPROB_FLOOR)))
            continue
        if not isinstance(entry, Mapping):
            raise MissingFieldError(f"a TensorRT-LLM log-probability entry is {entry!r}")
        values = {int(t): max(float(_logprob_of(v)), LOGPROB_FLOOR) for t, v in entry.items()}
        ranks = {int(t): _rank_of(v) for t, v in entry.items()}
        ranked = sorted(values, key=lambda t: (ranks[t] if ranks[t] is not None else 1 << 30, -values[t]))
        own = values.get(token, LOGPROB_FLOOR)
        out.append(TokenLogprob(token, own, tuple((t, values[t]) for t in ranked[:top])))
    return out


def step_logprobs(
    token_ids: Sequence[int], token_ids_diff: Sequence[int], logprobs: Sequence[Any] | None, top: int
) -> list[TokenLogprob]:
    """The new tokens' entries of `CompletionOutput.logprobs`, by token position rather than through
    `logprobs_diff`: `_handle_sequence` (executor/result.py) advances `_last_logprobs_len` only on
    the executor's own `log_probs` path, while the top-k path replaces `output.logprobs` with
    `logprobs_result.generation`. A list as long as the output (or longer by a trimmed stop token's
    entry) is sliced at the new tokens' positions; one as long as the new tokens is theirs."""
    full = list(logprobs or ())
    new = len(token_ids_diff)
    if len(full) >= len(token_ids):
        start = len(token_ids) - new
        window = full[start : start + new]
    elif len(full) == new:
        window = full
    else:
        raise MissingFieldError(
            f"TensorRT-LLM returned {len(full)} log-probabilities for an output of {len(token_ids)} tokens"
        )
    return token_logprobs(token_ids_diff, window, top)


def _logprob_of(value: Any) -> float:
    return float(value.logprob if hasattr(value, "logprob") else value["logprob"])


def _rank_of(value: Any) -> int | None:
    rank = getattr(value, "rank", None) if not isinstance(value, Mapping) else value.get("rank")
    return None if rank is None else int(rank)


def model_vocab_size(config: Mapping[str, Any]) -> int | None:
    """The logits' width from a Hugging Face `config.json` (`vocab_size`, at the top or in the
    language model's `text_config` / `llm_config` of multimodal models); None when it has none."""
    for holder in (config, config.get("text_config"), config.get("llm_config")):
        if isinstance(holder, Mapping):
            size = holder.get("vocab_size")
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size
    return None


def embedding_bias(logit_bias: Sequence[tuple[int, float]], vocab_size: int | None) -> list[float]:
    """`logit_bias` as TensorRT-LLM's `SamplingParams.embedding_bias` values: one FP32 per vocabulary
    entry (shape `[vocab_size]`), added to the logits by the PyTorch sampler. Raises ValueError (a
    400) for a token outside the vocabulary or an unknown vocabulary size."""
    if vocab_size is None:
        raise ValueError("logit_bias: this model's vocabulary size is unknown (no vocab_size in config.json)")
    values = [0.0] * vocab_size
    for token, bias in logit_bias:
        if not 0 <= token < vocab_size:
            raise ValueError(f"logit_bias: token {token} is outside the vocabulary (0..{vocab_size - 1})")
        values[token] = float(bias)
    return values


class GuidedDecodingUnavailable(ValueError):
    """A constraint this LLM cannot enforce (no backend, or a grammar its backend cannot read)."""


_START = re.compile(r"^start:", re.MULTILINE)


def grammar_with_stops(grammar: str, stop_token_ids: Sequence[int]) -> str:
    """The constraint's Lark grammar, ending optionally with one of the request's stop tokens.

    TensorRT-LLM's llguidance matcher takes one EOS (the tokenizer's: `LLGuidanceMatcherFactory`
    refuses `stop_token_ids` of another size) and, once the grammar is done, accepts only that
    token; a family whose turn ends with another token (gpt-oss `<|call|>`, GLM `<|observation|>`)
    could then never stop. The grammar therefore names the stop tokens itself; generation ends on
    them (`stop_token_ids`) as on any unconstrained request.
    """
    if not stop_token_ids:
        return grammar
    body, found = _START.subn("agentserve_output:", grammar, count=1)
    if not found:
        raise GuidedDecodingUnavailable("the constraint's grammar has no start rule")
    stops = " | ".join(f"<[{t}]>" for t in dict.fromkeys(stop_token_ids))
    return f"start: agentserve_output ({stops})?\n{body}"


def guided_decoding_kwargs(
    constraint: Constraint, stop_token_ids: Sequence[int], backend: str | None
) -> dict[str, Any]:
    """`GuidedDecodingParams(**…)` for a constraint (sampling_params.py: one of `json`, `regex`,
    `grammar`, `json_object`, `structural_tag`).

    - llguidance: `grammar`, which its matcher factory compiles with `grammar_from_lark` (Lark, not
      EBNF) — the constraint's own source, stop tokens added (`grammar_with_stops`);
    - xgrammar: only a constraint that is one JSON value maps (`json`: the schema); its `grammar` is
      GBNF-style EBNF and cannot take our Lark source, so anything else is refused;
    - no backend: refused (TensorRT-LLM 1.2.1 drops the guide silently without one).
    """
    if backend is None:
        raise GuidedDecodingUnavailable(
            "this worker's TensorRT-LLM has no guided_decoding_backend: constrained requests are refused"
        )
    if backend == "llguidance":
        return {"grammar": grammar_with_stops(constraint.grammar, stop_token_ids)}
    if backend == "xgrammar" and constraint.json_schema is not None:
        return {"json": json.dumps(dict(constraint.json_schema))}
    raise GuidedDecodingUnavailable(
        f"guided_decoding_backend {backend!r} cannot enforce this constraint (tool calls or a reasoning "
        "block need the llguidance backend)"
    )


_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "abort",
    "timeout": "error",
}


def finish_reason(value: Any) -> FinishReason | None:
    """TensorRT-LLM's `CompletionOutput.finish_reason` → ours (None: not finished)."""
    if value is None:
        return None
    name = str(getattr(value, "name", value)).lower()
    if name in ("not_finished", "none"):
        return None
    return _FINISH.get(name, "error")


class MissingFieldError(RuntimeError):
    """A TensorRT-LLM result lacks a field this adapter reads: the release is not the one it was
    written against. Never default it (a silent 0 would read as "no cache hits" forever)."""


def cached_tokens_of(result: Any) -> int:
    """Prompt tokens served from the KV cache, from the streamed result's `cached_tokens`."""
    try:
        value = result.cached_tokens
    except AttributeError:
        raise MissingFieldError(
            "this TensorRT-LLM release's GenerationResult has no `cached_tokens`: prefix-cache hits "
            "cannot be reported (the adapter needs a release that has it; see docs/worker.md)"
        ) from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise MissingFieldError(f"GenerationResult.cached_tokens is {value!r}, not a token count")
    return value


def clamp_cached(cached: int | None, prompt_tokens: int) -> int:
    """At least one prompt token is always computed (as Dynamo reports it)."""
    return max(0, min(cached or 0, prompt_tokens - 1))


def make_step(
    token_ids_diff: Sequence[int],
    text_diff: str,
    *,
    finished: bool,
    raw_finish_reason: Any,
    cached_tokens: int | None,
    prompt_tokens: int,
    output_tokens: int,
    first: bool,
    aborted: bool = False,
    logprobs: list[TokenLogprob] | None = None,
) -> Step:
    cached = clamp_cached(cached_tokens, prompt_tokens)
    reason = finish_reason(raw_finish_reason) if finished else None
    if finished and reason is None:
        reason = "abort" if aborted else "stop"
    if aborted and reason == "stop":
        reason = "abort"
    usage = Usage(prompt_tokens, output_tokens, cached) if reason is not None else None
    return Step(list(token_ids_diff), text_diff, cached if first else None, reason, usage, logprobs)


# --------------------------------------------------------------------------------------------------
# KV events


def _token_ids(tokens: Sequence[Any]) -> list[int]:
    return [t["token_id"] if isinstance(t, Mapping) else int(t) for t in tokens]


class KvEventTranslator:
    """Stateful translation of TensorRT-LLM KV cache events into ours (see the module docstring).

    Partial blocks (fewer tokens than a block) and blocks whose parent is unknown (its event was
    lost, or it was partial) are not published; their later removal is swallowed. Events of an
    attention window smaller than the largest seen (sliding-window layers) are dropped. Several
    engine blocks with the same tokens (different salts) share one hash of ours: it is stored when
    the first appears and removed when the last goes.
    """

    def __init__(self, block_size: int, seed: int = 0, dp_rank: int | None = None) -> None:
        self.block_size = block_size
        self.seed = seed
        self.dp_rank = dp_rank  # the attention-DP rank whose events this translates (None: no DP)
        self._ours: dict[int, int] = {}  # engine block hash -> our block hash
        self._count: dict[int, int] = {}  # our block hash -> engine blocks behind it
        self._ignored: set[int] = set()
        self._on_host: set[int] = set()  # our block hashes the engine holds in its host tier
        self._seq = 0
        self._last_event_id: int | None = None
        self._window: int | None = None
        self.engine_gaps = 0  # jumps in TensorRT-LLM's own event ids (its buffer overflowed)
        self.skipped_blocks = 0

    @property
    def seq(self) -> int:
        return self._seq

    def snapshot(self) -> KvSnapshot:
        host = self._on_host
        gpu = tuple(h for h in self._count if h not in host)
        hosted = tuple(h for h in self._count if h in host)
        return KvSnapshot(self._seq, self.block_size, gpu, hosted, self.dp_rank)

    def _tag(self, events: list[KvEvent]) -> list[KvEvent]:
        rank = self.dp_rank
        return events if rank is None or not events else [replace(e, dp_rank=rank) for e in events]

    def reset(self) -> list[KvEvent]:
        return self._tag(self._reset())

    def _reset(self) -> list[KvEvent]:
        self._ours.clear()
        self._count.clear()
        self._ignored.clear()
        self._on_host.clear()
        return [AllCleared(self._next())]

    def feed(self, event: Mapping[str, Any] | str) -> list[KvEvent]:
        if isinstance(event, str):  # some releases hand out JSON text
            event = json.loads(event)
            assert isinstance(event, Mapping)
        return self._tag(self._feed(event))

    def _feed(self, event: Mapping[str, Any]) -> list[KvEvent]:
        event_id = event.get("event_id")
        if isinstance(event_id, int):
            # Against the highest id seen (not the last): whether the ids count per attention
            # window or across windows, interleaved windows never look like a loss.
            last = self._last_event_id
            gap = last is not None and event_id > last + 1
            self._last_event_id = event_id if last is None else max(last, event_id)
            if gap:
                # TensorRT-LLM's event buffer overflowed: what we publish no longer matches its
                # cache. Resync: clear (the router forgets this worker's blocks rather than route to
                # blocks that may be gone) and rebuild from the events that follow.
                self.engine_gaps += 1
                return self._reset() + self._translate(event)
        return self._translate(event)

    def _translate(self, event: Mapping[str, Any]) -> list[KvEvent]:
        window = event.get("window_size")
        if isinstance(window, int):
            if self._window is None or window > self._window:
                self._window = window
            elif window < self._window:
                return []
        data = event.get("data")
        if not isinstance(data, Mapping):
            return []
        kind = data.get("type")
        if kind == "created":
            return self._reset()
        if kind == "stored":
            return self._stored(data)
        if kind == "removed":
            return self._removed(data.get("block_hashes") or [])
        if kind == "updated":
            return self._updated(data)
        return []

    def _updated(self, data: Mapping[str, Any]) -> list[KvEvent]:
        """A block moved between GPU and host (a priority-only update changes nothing we publish)."""
        medium = updated_medium(data)
        ours = self._ours.get(data.get("block_hash"))  # type: ignore[arg-type]
        if medium is None or ours is None:
            return []
        if medium == MEDIUM_CPU:
            self._on_host.add(ours)
        else:
            self._on_host.discard(ours)
        return [BlockStored(self._next(), (ours,), None, self.block_size, medium)]

    def _stored(self, data: Mapping[str, Any]) -> list[KvEvent]:
        blocks = data.get("blocks") or []
        engine_parent = data.get("parent_hash")
        parent: int | None = None
        if engine_parent is not None:
            found = self._ours.get(engine_parent)
            if found is None:
                self._skip(b.get("block_hash") for b in blocks)
                return []
            parent = found
        events: list[KvEvent] = []
        run: list[int] = []
        run_parent = parent
        level = blocks[0].get("cache_level", PRIMARY_CACHE_LEVEL) if blocks else PRIMARY_CACHE_LEVEL
        medium = medium_of(level)
        for i, block in enumerate(blocks):
            engine_hash = block.get("block_hash")
            tokens = _token_ids(block.get("tokens") or [])
            if len(tokens) != self.block_size or block.get("lora_id") is not None:
                # Partial (or LoRA: another hash space): it and everything after it stay unpublished.
                self._skip(b.get("block_hash") for b in blocks[i:])
                break
            ours = block_hashes(tokens, self.block_size, self.seed, parent)[0]
            previous = self._ours.get(engine_hash)
            if previous is None:
                self._ours[engine_hash] = ours
                count = self._count.get(ours, 0)
                self._count[ours] = count + 1
                is_new = count == 0
            else:
                is_new = False  # the engine re-announced a block it already holds
            if is_new:
                if not run:
                    run_parent = parent
                run.append(ours)
            elif run:
                events.append(self._stored_event(run, run_parent, medium))
                run = []
            parent = ours
        if run:
            events.append(self._stored_event(run, run_parent, medium))
        return events

    def _removed(self, engine_hashes: Sequence[int]) -> list[KvEvent]:
        gone: list[int] = []
        for engine_hash in engine_hashes:
            if engine_hash in self._ignored:
                self._ignored.discard(engine_hash)
                continue
            ours = self._ours.pop(engine_hash, None)
            if ours is None:
                continue
            count = self._count[ours] - 1
            if count:
                self._count[ours] = count
            else:
                del self._count[ours]
                self._on_host.discard(ours)
                gone.append(ours)
        return [BlockRemoved(self._next(), tuple(gone))] if gone else []

    def _skip(self, engine_hashes: Any) -> None:
        for h in engine_hashes:
            if h is not None:
                self._ignored.add(h)
                self.skipped_blocks += 1

    def _stored_event(self, run: list[int], parent: int | None, medium: str = MEDIUM_GPU) -> BlockStored:
        if medium == MEDIUM_CPU:
            self._on_host.update(run)
        return BlockStored(self._next(), tuple(run), parent, len(run) * self.block_size, medium)

    def _next(self) -> int:
        self._seq += 1
        return self._seq


# --------------------------------------------------------------------------------------------------
# Attention data parallelism


def attention_dp_ranks(kwargs: Mapping[str, Any]) -> int:
    """How many attention-DP ranks `LLM(**kwargs)` runs: with `enable_attention_dp` every
    tensor-parallel rank runs attention for its own requests over its own KV cache (the
    attention-DP size is the TP size), else one."""
    if not kwargs.get("enable_attention_dp"):
        return 1
    return max(1, int(kwargs.get("tensor_parallel_size") or 1))


class RankedKvTranslator:
    """One `KvEventTranslator` per attention-DP rank: TensorRT-LLM's serialized events carry
    `attention_dp_rank` when attention DP is on (`KVCacheEventSerializer.to_json_str`), and each
    rank numbers its own `event_id`s from its own `created` (0), so each rank is a stream of its
    own: our events carry `dp_rank` and are numbered per rank. With one rank it is the plain
    translator (events and snapshot without a rank)."""

    def __init__(self, block_size: int, seed: int = 0, ranks: int = 1) -> None:
        self.ranks = ranks
        self.translators: dict[int | None, KvEventTranslator]
        if ranks > 1:
            self.translators = {r: KvEventTranslator(block_size, seed, r) for r in range(ranks)}
        else:
            self.translators = {None: KvEventTranslator(block_size, seed)}

    def reset(self) -> list[KvEvent]:
        return [e for t in self.translators.values() for e in t.reset()]

    def feed(self, event: Mapping[str, Any] | str) -> list[KvEvent]:
        if isinstance(event, str):
            event = json.loads(event)
            assert isinstance(event, Mapping)
        if self.ranks == 1:
            return self.translators[None].feed(event)
        # A missing rank is rank 0 (as Dynamo's publisher reads it); an unknown one is a format
        # change that must fail loudly, never land in another rank's stream.
        rank = event.get("attention_dp_rank", 0)
        translator = self.translators.get(rank) if type(rank) is int else None
        if translator is None:
            raise ValueError(f"KV event of attention-DP rank {rank!r}; this engine has {self.ranks} ranks")
        return translator.feed(event)

    def snapshot(self, dp_rank: int | None = None) -> KvSnapshot:
        translator = self.translators.get(dp_rank)
        if translator is None:
            raise KeyError(dp_rank)
        return translator.snapshot()

    @property
    def engine_gaps(self) -> int:
        return sum(t.engine_gaps for t in self.translators.values())


def scheduling_kwargs(dp_rank: int | None, ranks: int) -> dict[str, Any] | None:
    """`SchedulingParams` keyword arguments pinning a request to the router's attention-DP rank
    (None: not pinned). `attention_dp_relax=False` keeps it there: relaxed (TensorRT-LLM's
    default) the engine may balance it onto a rank that lacks its cached prefix."""
    if dp_rank is None or ranks <= 1:
        return None
    if not 0 <= dp_rank < ranks:
        raise ValueError(f"dp_rank {dp_rank} is not a rank of this engine (0..{ranks - 1})")
    return {"attention_dp_rank": dp_rank, "attention_dp_relax": False}


# --------------------------------------------------------------------------------------------------
# Iteration stats


def load_from_stats(stats: Mapping[str, Any] | str) -> dict[str, int]:
    """Fields of `Load` found in one iteration-stats record (missing ones are left out)."""
    if isinstance(stats, str):
        stats = json.loads(stats)
        assert isinstance(stats, Mapping)
    out: dict[str, int] = {}
    kv = stats.get("kvCacheStats")
    if isinstance(kv, Mapping):
        if isinstance(kv.get("usedNumBlocks"), int):
            out["kv_blocks_used"] = kv["usedNumBlocks"]
        if isinstance(kv.get("maxNumBlocks"), int):
            out["kv_blocks_total"] = kv["maxNumBlocks"]
    if isinstance(stats.get("numActiveRequests"), int):
        out["running"] = stats["numActiveRequests"]
    if isinstance(stats.get("numQueuedRequests"), int):
        out["waiting"] = stats["numQueuedRequests"]
    return out
