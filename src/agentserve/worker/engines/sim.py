"""The simulated engine: a real scheduler and KV cache, simulated time, scripted or echoed text.

Everything that decides behaviour is pure and lives in its own module (`kvpool`, `scheduler`,
`timing`, `outputs`); this module is the asyncio edge: it runs the scheduler's iterations, sleeps
each iteration's simulated duration divided by `speedup`, hands tokens to request streams and KV
events to subscribers.

With `speedup` 0 or infinity iterations take no simulated time (benchmarks, tests). The loop then
runs iterations back to back and yields to the event loop every `zero_time_slice_s` (5 ms), as a
real engine runs beside the serving loop (on its GPU, in its own process) rather than in lockstep
with it: consumers that lag receive merged steps (several tokens at once), exactly as with
TensorRT-LLM's `token_ids_diff`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from agentserve.conversation import FinishReason, Usage
from agentserve.worker.constrained import constrained_plan, constrained_sample, vocab_size
from agentserve.worker.engine import (
    DuplicateRequestError,
    EngineError,
    EngineNotReadyError,
    GenerateRequest,
    InvalidRequestError,
    KvEvent,
    KvSnapshot,
    KvTransfer,
    Load,
    SamplingParams,
    Step,
    TokenLogprob,
)
from agentserve.worker.events import EventHub
from agentserve.worker.kvpool import KvPool
from agentserve.worker.outputs import EchoPolicy, OutputPolicy, context_for, hints_complete
from agentserve.worker.profiles import default_timing
from agentserve.worker.sampling import sample_plan
from agentserve.worker.scheduler import Scheduler, SchedulerConfig, SimSequence, StepOutcome
from agentserve.worker.timing import TimingModel
from agentserve.worker.tokenizer import ByteTokenizer, Tokenizer, token_pieces


@dataclass(frozen=True, slots=True)
class SimConfig:
    num_blocks: int = 32768
    block_size: int = 32
    host_blocks: int = 0  # host-tier KV blocks (0: evicted blocks are dropped)
    honour_retention: bool = True  # False (--kv-retention off): every block in the default class
    hash_seed: int = 0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    timing: TimingModel = field(default_factory=default_timing)
    speedup: float = 1.0  # simulated seconds per real second; 0 or inf: no waiting
    zero_time_slice_s: float = 5e-3  # run iterations this long between yields (no waiting, or behind)
    catch_up_s: float = 0.05  # at most this much wall time behind the simulated clock is caught up
    load_delay_s: float = 0.0  # simulated model load: `start` takes this long (÷ speedup) to be ready
    # Disaggregated prefill: a context-only request's KV is held this long (wall seconds) for a
    # decode worker to pull, then released (the blocks stay cached as any finished prefix).
    kv_hold_s: float = 60.0

    @property
    def zero_time(self) -> bool:
        return self.speedup == 0 or math.isinf(self.speedup)


# How a decode worker pulls a prompt's KV from a prefill worker: the tokens pulled, None on failure
# (the source is gone, or no longer holds it). In-process: the source engine's `kv_pull`; across
# processes: the prefill worker's `POST /kv/pull` (agentserve.worker.client).
KvPeer = Callable[[KvTransfer], Awaitable[int | None]]

PLAN_CACHE = 256  # outputs remembered (text, stops, length) -> (ids, pieces)
PIECE_WINDOW = 32  # token_pieces' look-ahead: tokens kept past the ones needed


class _SimStream:
    """The steps of one request; the engine pushes, the consumer pulls merged steps."""

    __slots__ = (
        "_cached",
        "_closed",
        "_engine",
        "_finish",
        "_ids",
        "_kv",
        "_listener",
        "_lps",
        "_received",
        "_texts",
        "_usage",
        "_waiter",
        "logprobs",
        "pieces",
        "request_id",
    )

    def __init__(
        self,
        engine: SimEngine,
        request_id: str,
        pieces: Sequence[str],
        logprobs: Sequence[TokenLogprob] | None = None,
    ) -> None:
        self._engine = engine
        self.request_id = request_id
        self.pieces = pieces
        self.logprobs = logprobs  # per output token, when the request asked for them
        self._lps: list[TokenLogprob] | None = None if logprobs is None else []
        self._ids: list[int] = []
        self._texts: list[str] = []
        self._cached: int | None = None
        self._received: int | None = None
        self._kv: KvTransfer | None = None
        self._finish: FinishReason | None = None
        self._usage: Usage | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._listener: Callable[[], None] | None = None
        self._closed = False  # the last step was handed out, or the consumer closed

    # -- engine side ------------------------------------------------------------------------------

    def cached(self, n: int) -> None:
        self._cached = n  # goes out with the first step

    def received(self, n: int) -> None:
        self._received = n  # goes out with the first step

    def hold(self, kv: KvTransfer) -> None:
        self._kv = kv  # goes out with the last step

    def push(self, token_id: int, text: str, index: int) -> None:
        self._ids.append(token_id)
        self._texts.append(text)
        if self._lps is not None and self.logprobs is not None:
            self._lps.append(self.logprobs[index])
        self._wake()

    def finish(self, reason: FinishReason, usage: Usage) -> None:
        if self._finish is None:
            self._finish, self._usage = reason, usage
            self._wake()

    def _wake(self) -> None:
        listener = self._listener
        if listener is not None:
            listener()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- consumer side ----------------------------------------------------------------------------

    def listen(self, listener: Callable[[], None]) -> None:
        """Push mode, instead of iterating: `listener` is called when a step may be ready and the
        consumer `take`s it (the worker's mux connection: no task wake-up per stream per step)."""
        self._listener = listener
        if self._ids or self._finish is not None:
            listener()

    def take(self) -> Step | None:
        """The merged step ready now, or None (nothing yet, or the stream ended)."""
        if self._closed or (not self._ids and self._finish is None):
            return None
        return self._merged()

    def __aiter__(self) -> _SimStream:
        return self

    async def __anext__(self) -> Step:
        while not self._ids and self._finish is None:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._closed:
            raise StopAsyncIteration
        return self._merged()

    def _merged(self) -> Step:
        ids, self._ids = self._ids, []
        texts, self._texts = self._texts, []
        cached, self._cached = self._cached, None
        lps = self._lps
        if lps is not None:
            self._lps = []
        received, self._received = self._received, None
        if self._finish is None:
            if lps is None and received is None:
                return Step(ids, "".join(texts), cached)  # the common step
            return Step(ids, "".join(texts), cached, logprobs=lps, received_tokens=received)
        self._closed = True
        return Step(
            ids,
            "".join(texts),
            cached,
            self._finish,
            self._usage,
            logprobs=lps,
            kv_transfer=self._kv,
            received_tokens=received,
        )

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._finish is None:
                self._engine.abort(self.request_id)
            self._wake()


class SimEngine:
    """The `Engine` protocol over a simulated GPU (see the module docstring)."""

    def __init__(
        self,
        config: SimConfig | None = None,
        tokenizer: Tokenizer | None = None,
        policy: OutputPolicy | None = None,
        *,
        dp_rank: int | None = None,
        hub: EventHub | None = None,
        kv_peer: KvPeer | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.kv_peer = kv_peer  # None: a request arriving with `kv_transfer` prefills locally
        # One attention-DP rank of a `DpSimEngine` (its events and snapshot carry the rank, its
        # events go to the shared hub); None: a whole engine.
        self.dp_rank = dp_rank
        self.tokenizer: Tokenizer = tokenizer or ByteTokenizer()
        self.policy: OutputPolicy = policy or EchoPolicy()
        self.pool = KvPool(self.config.num_blocks, self.config.block_size, self.config.host_blocks)
        self.scheduler = Scheduler(self.pool, self.config.scheduler, self.config.hash_seed)
        self._streams: dict[str, _SimStream] = {}
        self._plans: OrderedDict[tuple[object, ...], tuple[list[int], list[str]]] = OrderedDict()
        self._constrained = 0  # requests with a constraint, and the CPU spent enforcing them (`Load`)
        self._constraint_cpu = 0.0
        self._hub = hub if hub is not None else EventHub()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._ready = False
        self._ids = itertools.count()
        # Disaggregated prefill: KV held for decode workers (handle -> (block hashes, release at)),
        # and requests waiting for their pull (request id -> the pulling task).
        self._held: dict[str, tuple[list[int], float]] = {}
        self._context_only: set[str] = set()
        self._pulling: dict[str, asyncio.Task[None]] = {}

    # -- Engine protocol --------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def ready(self) -> bool:
        return self._ready

    async def start(self) -> None:
        if self._task is not None:
            return
        self.pool.clear()  # subscribers learn that this engine starts empty
        self._publish(self.pool.take_events())
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")
        if self.config.load_delay_s > 0 and not self.config.zero_time:
            await asyncio.sleep(self.config.load_delay_s / self.config.speedup)
        self._ready = True

    async def stop(self) -> None:
        self._ready = False
        for request_id in list(self._streams):
            self.abort(request_id)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._hub.close()

    def generate(self, request: GenerateRequest) -> _SimStream:
        if not self._ready:
            raise EngineNotReadyError("the simulated engine is not started")
        rid = request.request_id or f"sim-{next(self._ids)}"
        if rid in self._streams:
            raise DuplicateRequestError(f"request {rid!r} is still running")
        prompt = list(request.prompt_token_ids)
        self._validate(prompt, request.sampling)
        if request.context_only:  # prefill, one token, then hold the KV (TensorRT-LLM: max_tokens 1)
            request = replace(request, sampling=replace(request.sampling, max_tokens=1))
            self._context_only.add(rid)
        output, pieces, logprobs, end_reason = self._plan(request, prompt)
        seq = SimSequence(rid, prompt, len(prompt), output, end_reason, request.priority)
        seq.retention = request.retention if self.config.honour_retention else None
        stream = _SimStream(self, rid, pieces, logprobs)
        self._streams[rid] = stream
        if request.kv_transfer is not None:
            task = asyncio.get_running_loop().create_task(self._receive(seq, stream, request.kv_transfer))
            self._pulling[rid] = task
            task.add_done_callback(lambda _t: self._pulling.pop(rid, None))
            return stream
        self.scheduler.add(seq)
        self._wake.set()
        return stream

    async def _receive(self, seq: SimSequence, stream: _SimStream, transfer: KvTransfer) -> None:
        """Pull the prompt's KV from its prefill worker, wait the transfer's simulated time, then
        schedule the request with those tokens computed; a failed pull prefills them here."""
        pulled: int | None = None
        if self.kv_peer is not None:
            try:
                pulled = await self.kv_peer(transfer)
            except (TimeoutError, OSError, EngineError):
                pulled = None
        if pulled:
            if transfer.seconds > 0 and not self.config.zero_time:
                await asyncio.sleep(transfer.seconds / self.config.speedup)
            seq.received_tokens = min(pulled, seq.prompt_len)
        stream.received(seq.received_tokens)
        if seq.request_id not in self._streams:
            return  # aborted meanwhile
        self.scheduler.add(seq)
        self._wake.set()

    async def kv_pull(self, transfer: KvTransfer) -> int | None:
        """A decode worker takes the KV held under `transfer.handle`: the tokens it covers, None if
        nothing is held under it (never held, already taken, or expired)."""
        self._expire_holds()
        held = self._held.pop(transfer.handle, None)
        if held is None:
            return None
        hashes, _ = held
        self.pool.release(hashes)  # stays cached here: the next cold session sharing it hits
        return len(hashes) * self.block_size

    def _hold(self, seq: SimSequence, stream: _SimStream) -> None:
        """Keep a finished context-only request's prompt blocks referenced until pulled."""
        self._expire_holds()
        hashes = seq.hashes[: seq.prompt_len // self.block_size]
        if not hashes or not self.pool.acquire(hashes):
            return  # nothing to ship (a prompt shorter than a block), or evicted: the pull fails
        loop = asyncio.get_running_loop()
        self._held[seq.request_id] = (hashes, loop.time() + self.config.kv_hold_s)
        stream.hold(KvTransfer(seq.request_id, len(hashes) * self.block_size))

    def _expire_holds(self) -> None:
        if not self._held:
            return
        now = asyncio.get_running_loop().time()
        for handle in [h for h, (_, until) in self._held.items() if until <= now]:
            self.pool.release(self._held.pop(handle)[0])

    def abort(self, request_id: str) -> bool:
        self._context_only.discard(request_id)
        pulling = self._pulling.pop(request_id, None)
        if pulling is not None:  # still pulling its KV: never scheduled
            pulling.cancel()
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.finish("abort", Usage(0, 0, 0))
            return True
        seq = self.scheduler.abort(request_id)
        stream = self._streams.pop(request_id, None)
        if stream is not None and seq is not None:
            stream.finish("abort", _usage(seq))
        return seq is not None

    def has_request(self, request_id: str) -> bool:
        """The request is still queued or running here."""
        return request_id in self._streams

    def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        return self._hub.subscribe()

    def kv_snapshot(self, dp_rank: int | None = None) -> KvSnapshot:
        if dp_rank != self.dp_rank:
            raise InvalidRequestError(f"this engine has no attention-DP rank {dp_rank}")
        snap = self.pool.snapshot()
        return snap if self.dp_rank is None else replace(snap, dp_rank=self.dp_rank)

    def _publish(self, events: list[KvEvent]) -> None:
        rank = self.dp_rank
        self._hub.publish(events if rank is None else [replace(e, dp_rank=rank) for e in events])

    def load(self) -> Load:
        s = self.scheduler
        return Load(
            running=len(s.running),
            waiting=s.num_waiting,
            kv_blocks_used=self.pool.used,
            kv_blocks_total=self.pool.num_blocks,
            kv_blocks_cached=self.pool.cached_free,
            kv_blocks_retained=self.pool.retained,
            kv_blocks_pinned=self.pool.pinned,
            kv_host_blocks_used=self.pool.host_used,
            kv_host_blocks_total=self.pool.host_blocks,
            prompt_tokens=s.prompt_tokens,
            cached_prompt_tokens=s.cached_prompt_tokens,
            generated_tokens=s.generated_tokens,
            requests_finished=s.finished_count,
            requests_aborted=s.aborted_count,
            preemptions=s.preemptions,
            constrained_requests=self._constrained,
            constraint_cpu_seconds=self._constraint_cpu,
        )

    # -- submission -------------------------------------------------------------------------------

    def _validate(self, prompt: list[int], sampling: SamplingParams) -> None:
        if not prompt:
            raise InvalidRequestError("the prompt has no tokens")
        if sampling.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1")
        need = self.scheduler.blocks_for(len(prompt) + 1)
        if need > self.pool.num_blocks:
            raise InvalidRequestError(
                f"a prompt of {len(prompt)} tokens needs {need} KV blocks; the cache holds "
                f"{self.pool.num_blocks}"
            )
        sched = self.config.scheduler
        if not sched.chunked_prefill and len(prompt) > sched.max_num_tokens:
            raise InvalidRequestError(
                f"a prompt of {len(prompt)} tokens exceeds max_num_tokens ({sched.max_num_tokens}) "
                "and chunked prefill is off"
            )

    def _plan(
        self, request: GenerateRequest, prompt: list[int]
    ) -> tuple[list[int], list[str], list[TokenLogprob] | None, FinishReason]:
        """The output token ids, their streamed text pieces, their log-probabilities (when asked
        for), and why the output ends."""
        hints = request.hints
        resumed = hints.resumed_tokens if hints is not None else 0
        # A migrated request's prompt ends with the output already streamed: the context is the
        # prompt before it (else the policy would read a partial reply as the conversation).
        original = prompt[: len(prompt) - resumed] if 0 < resumed < len(prompt) else prompt
        prompt_text = None if hints_complete(hints) else self.tokenizer.decode(original)
        text = self.policy.respond(context_for(hints, prompt_text))
        sampling = request.sampling
        ids, pieces = self._output(text, sampling, resumed + sampling.max_tokens)
        complete = True
        seed = sampling.seed if sampling.seed is not None else len(original)
        need = resumed + sampling.max_tokens
        if request.constraint is not None:  # the grammar's mask steers the plan (worker/constrained.py)
            self._constrained += 1
            started = time.thread_time()
            steered = constrained_plan(
                self.tokenizer,
                request.constraint,
                script=ids,
                pieces=pieces,
                sampling=sampling,
                need=need,
                seed=seed,
            )
            ids, pieces, complete = steered.token_ids, steered.pieces, steered.complete
            self._constraint_cpu += time.thread_time() - started
        logprobs: list[TokenLogprob] | None = None
        if sampling.logprobs is not None or sampling.logit_bias:  # worker/sampling.py
            if request.constraint is not None:
                started = time.thread_time()
                sampled = constrained_sample(
                    self.tokenizer,
                    request.constraint,
                    ids,
                    sampling=sampling,
                    need=need,
                    seed=seed,
                    plan_complete=complete,
                )
                complete = sampled.complete
                self._constraint_cpu += time.thread_time() - started
            else:
                sampled = sample_plan(
                    ids[:need],
                    vocab=vocab_size(self.tokenizer),
                    bias=dict(sampling.logit_bias),
                    top=sampling.logprobs,
                )
            if sampled.token_ids != ids[: len(sampled.token_ids)] or len(sampled.token_ids) > len(ids):
                pieces = token_pieces(self.tokenizer, sampled.token_ids, PIECE_WINDOW)
            else:
                pieces = pieces[: len(sampled.token_ids)]
            ids, logprobs = sampled.token_ids, sampled.logprobs
        if resumed:  # a migrated request: what the dead worker already streamed is in the prompt
            ids, pieces = ids[resumed:], pieces[resumed:]
            logprobs = logprobs[resumed:] if logprobs is not None else None
        end_reason: FinishReason = "stop" if complete else "length"
        limit = sampling.max_tokens
        if sampling.ignore_eos and ids and len(ids) < limit and request.constraint is None:
            reps = -(-limit // len(ids))
            ids, pieces = (ids * reps)[:limit], (pieces * reps)[:limit]
            logprobs = (logprobs * reps)[:limit] if logprobs is not None else None
            end_reason = "length"
        elif len(ids) > limit:
            ids, pieces, end_reason = ids[:limit], pieces[:limit], "length"
            logprobs = logprobs[:limit] if logprobs is not None else None
        return ids, pieces, logprobs, end_reason

    def _output(self, text: str, sampling: SamplingParams, need: int) -> tuple[list[int], list[str]]:
        """The output's token ids (cut at stops) and pieces, at most `need` of them (+ a margin).

        Memoized: a scripted output is the same text for every request, and tokenizing it and
        cutting its pieces cost far more than simulating its tokens (63 % of a worker's CPU under
        bench/peers.py before). Only the first `need` tokens matter, so only those (plus the
        pieces' look-ahead window) are cut into pieces. The cached lists are never mutated.
        """
        key = (text, sampling.stop, sampling.stop_token_ids, sampling.include_stop, need)
        hit = self._plans.get(key)
        if hit is not None:
            self._plans.move_to_end(key)
            return hit
        ids = cut_at_stops(self.tokenizer.encode, text, sampling)
        if len(ids) > need + PIECE_WINDOW:
            ids = ids[: need + PIECE_WINDOW]
        plan = ids, token_pieces(self.tokenizer, ids, PIECE_WINDOW)
        self._plans[key] = plan
        if len(self._plans) > PLAN_CACHE:
            self._plans.popitem(last=False)
        return plan

    # -- the loop ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        zero_time = self.config.zero_time
        timing, speedup = self.config.timing, self.config.speedup
        slice_s = self.config.zero_time_slice_s
        clock = slice_start = loop.time()
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                clock = slice_start = loop.time()
                continue
            # Retention durations are simulated seconds (with no waiting: wall seconds).
            self.pool.now = loop.time() * (1.0 if zero_time else speedup)
            outcome = self.scheduler.step()
            if zero_time:
                self._deliver(outcome)
                now = loop.time()
                if now - slice_start >= slice_s:
                    await asyncio.sleep(0)
                    slice_start = loop.time()
            else:
                # The simulated clock runs ahead of the loop's, or catches up when the process fell
                # behind (at most `catch_up_s`): then iterations run back to back and each stream
                # gets every token due meanwhile as one merged step, as a real engine's consumer
                # that lags does, instead of one event-loop hop per token. Yielding every
                # `zero_time_slice_s` keeps the consumers' latency bounded.
                now = loop.time()
                clock = max(clock, now - self.config.catch_up_s) + timing.step_seconds(outcome.work) / speedup
                if clock > now:
                    await asyncio.sleep(clock - now)
                    slice_start = loop.time()
                elif now - slice_start >= slice_s:
                    await asyncio.sleep(0)
                    slice_start = loop.time()
                self._deliver(outcome)

    def _deliver(self, outcome: StepOutcome) -> None:
        streams = self._streams
        for seq in outcome.started:
            stream = streams.get(seq.request_id)
            if stream is not None:
                stream.cached(seq.cached_tokens or 0)
        for seq in outcome.emitted:
            stream = streams.get(seq.request_id)
            if stream is not None:
                i = seq.emitted - 1
                stream.push(seq.output[i], stream.pieces[i], i)
        for seq, reason in outcome.finished:
            stream = streams.pop(seq.request_id, None)
            if seq.request_id in self._context_only:
                self._context_only.discard(seq.request_id)
                if stream is not None:
                    self._hold(seq, stream)
            if stream is not None:
                stream.finish(reason, _usage(seq))
        self._publish(outcome.events)


def cut_at_stops(encode: Callable[[str], list[int]], text: str, sampling: SamplingParams) -> list[int]:
    """The output token ids up to the first stop, as TensorRT-LLM ends a sequence.

    Generation ends at the first stop string or stop token id; the stop itself stays in the output
    only with `include_stop` (TensorRT-LLM's `include_stop_str_in_output`, default False:
    `GenerationResultBase._handle_sequence` trims the matched stop word's ids from `token_ids`).
    """
    first: tuple[int, str] | None = None
    for stop in sampling.stop:
        at = text.find(stop) if stop else -1
        if at >= 0 and (first is None or at < first[0]):
            first = (at, stop)
    if first is not None:
        text = text[: first[0] + len(first[1])] if sampling.include_stop else text[: first[0]]
    ids = encode(text)
    if sampling.stop_token_ids:
        stops = set(sampling.stop_token_ids)
        for i, token in enumerate(ids):
            if token in stops:
                return ids[: i + 1] if sampling.include_stop else ids[:i]
    return ids


def _usage(seq: SimSequence) -> Usage:
    return Usage(input_tokens=seq.prompt_len, output_tokens=seq.emitted, cached_tokens=seq.cached_tokens or 0)
