from __future__ import annotations

import asyncio
import time

import pytest

from agentserve.worker.engine import (
    AllCleared,
    BlockStored,
    DuplicateRequestError,
    Engine,
    EngineNotReadyError,
    GenerateRequest,
    Hints,
    InvalidRequestError,
    KvEvent,
    SamplingParams,
    Step,
)
from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.outputs import EchoPolicy, OutputContext, ScriptPolicy
from agentserve.worker.scheduler import SchedulerConfig
from agentserve.worker.tokenizer import HFTokenizer

pytestmark = pytest.mark.anyio

BS = 4
PROMPT = list(range(1, 4 * BS + 3))
HINTS = Hints(turn=1, last_user_message="hello there", last_message="hello there")


def engine(tokenizer: HFTokenizer, speedup: float = 0, blocks: int = 256, **kw: object) -> SimEngine:
    cfg = SimConfig(num_blocks=blocks, block_size=BS, speedup=speedup, scheduler=SchedulerConfig(**kw))  # type: ignore[arg-type]
    return SimEngine(cfg, tokenizer)


def req(rid: str, prompt: list[int] = PROMPT, max_tokens: int = 200, **kw: object) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, **kw), hints=HINTS)  # type: ignore[arg-type]


async def collect(stream: object) -> list[Step]:
    return [step async for step in stream]  # type: ignore[attr-defined]


async def test_sim_engine_satisfies_the_protocol(tokenizer: HFTokenizer) -> None:
    assert isinstance(engine(tokenizer), Engine)


async def test_stream_is_the_echo_output_with_cached_tokens_first_and_usage_last(
    tokenizer: HFTokenizer,
) -> None:
    eng = engine(tokenizer)
    await eng.start()
    try:
        steps = await collect(eng.generate(req("a")))
        expected = EchoPolicy().respond(OutputContext(1, "hello there", "hello there"))
        assert "".join(s.text for s in steps) == expected
        ids = [t for s in steps for t in s.token_ids]
        assert tokenizer.decode(ids) == expected
        assert steps[0].cached_tokens == 0
        assert all(s.cached_tokens is None for s in steps[1:])
        assert [s.finish_reason for s in steps[:-1]] == [None] * (len(steps) - 1)
        last = steps[-1]
        assert last.finish_reason == "stop"
        assert last.usage is not None
        assert (last.usage.input_tokens, last.usage.output_tokens) == (len(PROMPT), len(ids))
        # The same prompt again: every full block comes from the cache.
        again = await collect(eng.generate(req("b")))
        assert again[0].cached_tokens == 4 * BS
        assert again[-1].usage is not None and again[-1].usage.cached_tokens == 4 * BS
        other = await collect(eng.generate(req("c", [999, *PROMPT[1:]])))
        assert other[0].cached_tokens == 0
        load = eng.load()
        assert (load.prompt_tokens, load.cached_prompt_tokens) == (3 * len(PROMPT), 4 * BS)
        assert load.requests_finished == 3 and load.running == 0 and load.kv_blocks_used == 0
    finally:
        await eng.stop()


async def test_max_tokens_cuts_with_length_and_ignore_eos_fills_to_max(tokenizer: HFTokenizer) -> None:
    eng = engine(tokenizer)
    await eng.start()
    try:
        steps = await collect(eng.generate(req("a", max_tokens=3)))
        assert sum(len(s.token_ids) for s in steps) == 3 and steps[-1].finish_reason == "length"
        steps = await collect(eng.generate(req("b", max_tokens=500, ignore_eos=True)))
        assert sum(len(s.token_ids) for s in steps) == 500 and steps[-1].finish_reason == "length"
    finally:
        await eng.stop()


async def test_stop_strings_cut_the_output(tokenizer: HFTokenizer) -> None:
    eng = engine(tokenizer)
    await eng.start()
    try:
        steps = await collect(eng.generate(req("a", stop=("</think>",))))
        assert "".join(s.text for s in steps) == "<think>\nThe user wrote 2 words. I will repeat it back.\n"
        assert steps[-1].finish_reason == "stop"
    finally:
        await eng.stop()


async def test_scripted_output_is_byte_exact(tokenizer: HFTokenizer) -> None:
    raw = (
        "<think>\nI should list the files — naïvely 😀.\n</think>\n\n"
        '<tool_call>\n{"name": "ls", "arguments": {"path": "./ü"}}\n</tool_call>'
    )
    policy = ScriptPolicy.from_mapping({"rules": [{"turn": 1, "output": raw}]}, EchoPolicy())
    eng = SimEngine(SimConfig(block_size=BS, speedup=0), tokenizer, policy)
    await eng.start()
    try:
        steps = await collect(eng.generate(req("a")))
        assert "".join(s.text for s in steps).encode() == raw.encode()
        assert tokenizer.decode([t for s in steps for t in s.token_ids]) == raw
    finally:
        await eng.stop()


async def test_without_hints_the_context_comes_from_the_decoded_prompt(tokenizer: HFTokenizer) -> None:
    prompt_text = "<|im_start|>user\nping pong<|im_end|>\n<|im_start|>assistant\n"
    eng = engine(tokenizer)
    await eng.start()
    try:
        request = GenerateRequest("a", tokenizer.encode(prompt_text), SamplingParams(max_tokens=200))
        text = "".join(s.text for s in await collect(eng.generate(request)))
        assert text.endswith('You said: "ping pong"')
    finally:
        await eng.stop()


async def test_abort_frees_blocks_and_ends_the_stream_with_abort(tokenizer: HFTokenizer) -> None:
    # Paced slowly enough (10,000 tokens take 4 s) that a loaded machine cannot finish the stream
    # before the assertions run.
    eng = engine(tokenizer, speedup=10)
    await eng.start()
    try:
        stream = eng.generate(req("a", max_tokens=10_000, ignore_eos=True))
        first = await stream.__anext__()
        assert first.token_ids
        assert eng.load().kv_blocks_used > 0
        assert eng.abort("a") is True
        assert eng.abort("a") is False
        rest = await collect(stream)
        assert rest[-1].finish_reason == "abort"
        assert eng.load().kv_blocks_used == 0 and eng.load().requests_aborted == 1
    finally:
        await eng.stop()


async def test_closing_the_stream_aborts_the_request(tokenizer: HFTokenizer) -> None:
    eng = engine(tokenizer, speedup=1000)
    await eng.start()
    try:
        stream = eng.generate(req("a", max_tokens=10_000, ignore_eos=True))
        await stream.__anext__()
        await stream.aclose()
        assert eng.load().running == 0 and eng.load().kv_blocks_used == 0
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
    finally:
        await eng.stop()


async def test_requests_that_can_never_run_are_rejected_up_front(tokenizer: HFTokenizer) -> None:
    eng = engine(tokenizer, blocks=4, max_num_tokens=8, chunked_prefill=False)
    with pytest.raises(EngineNotReadyError):
        eng.generate(req("a"))
    await eng.start()
    try:
        with pytest.raises(InvalidRequestError, match="KV blocks"):
            eng.generate(req("a", list(range(100))))
        with pytest.raises(InvalidRequestError, match="max_num_tokens"):
            eng.generate(req("a", list(range(12))))
        with pytest.raises(InvalidRequestError, match="no tokens"):
            eng.generate(req("a", []))
        with pytest.raises(InvalidRequestError, match="max_tokens"):
            eng.generate(req("a", [1], max_tokens=0))
        eng.generate(req("a", [1, 2], max_tokens=10_000, ignore_eos=True))
        with pytest.raises(DuplicateRequestError):
            eng.generate(req("a", [1, 2]))
    finally:
        await eng.stop()


async def test_kv_events_arrive_in_order_without_gaps_and_match_the_snapshot(tokenizer: HFTokenizer) -> None:
    eng = engine(tokenizer, blocks=24)
    sub = eng.kv_events()
    await eng.start()
    events: list[KvEvent] = []

    async def drain() -> None:
        async for batch in sub:
            events.extend(batch)

    task = asyncio.create_task(drain())
    try:
        for i in range(20):
            prompt = [i * 1000 + t for t in range(3 * BS + 1)]
            await collect(eng.generate(req(f"r{i}", prompt, max_tokens=2 * BS, ignore_eos=True)))
        await asyncio.sleep(0)
        assert isinstance(events[0], AllCleared)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        stored = {h for e in events if isinstance(e, BlockStored) for h in e.block_hashes}
        removed = {h for e in events if not isinstance(e, BlockStored | AllCleared) for h in e.block_hashes}
        assert removed  # 20 prompts × 5 blocks do not fit in 24 blocks
        snap = eng.kv_snapshot()
        assert snap.seq == events[-1].seq
        # Replaying the events gives the snapshot.
        held: set[int] = set()
        for e in events:
            if isinstance(e, AllCleared):
                held.clear()
            elif isinstance(e, BlockStored):
                held.update(e.block_hashes)
            else:
                held.difference_update(e.block_hashes)
        assert held == set(snap.block_hashes) and held <= stored
    finally:
        await eng.stop()
        await task


async def test_timing_model_paces_iterations(tokenizer: HFTokenizer) -> None:
    # 20 tokens at ~4 ms each, 10x faster: about 8 ms in all; zero-time is much faster.
    slow = engine(tokenizer, speedup=10)
    fast = engine(tokenizer, speedup=float("inf"))
    loop = asyncio.get_running_loop()
    durations = []
    for eng in (slow, fast):
        await eng.start()
        t0 = loop.time()
        await collect(eng.generate(req("a", max_tokens=20, ignore_eos=True)))
        durations.append(loop.time() - t0)
        await eng.stop()
    assert durations[0] >= 20 * 4e-3 / 10 * 0.9
    assert durations[1] < durations[0]


async def test_a_lagging_consumer_gets_merged_steps(tokenizer: HFTokenizer) -> None:
    eng = engine(tokenizer)
    await eng.start()
    try:
        stream = eng.generate(req("a", max_tokens=300, ignore_eos=True))
        await asyncio.sleep(0.05)  # let the zero-time engine run ahead
        steps = await collect(stream)
        assert len(steps) < 300
        assert sum(len(s.token_ids) for s in steps) == 300
    finally:
        await eng.stop()


async def test_a_paced_engine_that_fell_behind_catches_up_with_merged_steps(tokenizer: HFTokenizer) -> None:
    # ~4 ms per token at 10x: 0.4 ms each. Blocking the loop for 40 ms puts the engine ~100 tokens
    # behind its simulated clock; it then runs the iterations due back to back (one slice), so the
    # consumer's next step carries many tokens instead of one per loop hop.
    eng = engine(tokenizer, speedup=10)
    await eng.start()
    try:
        stream = eng.generate(req("a", max_tokens=200, ignore_eos=True))
        first = await stream.__anext__()
        time.sleep(0.04)  # the process stalls (the engine cannot run)
        steps = [first, *await collect(stream)]
        assert sum(len(s.token_ids) for s in steps) == 200
        assert max(len(s.token_ids) for s in steps) > 5
    finally:
        await eng.stop()


async def test_a_scripted_output_is_planned_once_and_cut_to_max_tokens(tokenizer: HFTokenizer) -> None:
    raw = "word " * 3000
    policy = ScriptPolicy.from_mapping({"rules": [], "default": raw}, EchoPolicy())
    eng = SimEngine(SimConfig(block_size=BS, speedup=0), tokenizer, policy)
    calls = 0
    encode = tokenizer.encode

    def counting(text: str) -> list[int]:
        nonlocal calls
        calls += 1
        return encode(text)

    eng.tokenizer.encode = counting  # type: ignore[method-assign]
    await eng.start()
    try:
        for rid in ("a", "b", "c"):
            steps = await collect(eng.generate(req(rid, max_tokens=7)))
            ids = [t for s in steps for t in s.token_ids]
            assert len(ids) == 7 and steps[-1].finish_reason == "length"
            assert "".join(s.text for s in steps) == raw[: len("".join(s.text for s in steps))]
            assert tokenizer.decode(ids).startswith("".join(s.text for s in steps))
        assert calls == 1  # same text, stops and length: one plan
        steps = await collect(eng.generate(req("d", max_tokens=9)))
        assert sum(len(s.token_ids) for s in steps) == 9 and calls == 2
    finally:
        await eng.stop()


@pytest.mark.parametrize("k", [1, 3, 7, 12, 20])
async def test_a_migrated_request_without_hints_continues_the_same_output(k: int) -> None:
    # The prompt of a migrated request ends with the k tokens already streamed; the context (here
    # the whole decoded prompt: no chat markup) must come from the prompt before them.
    prompt = list(range(1, 20))
    eng = SimEngine(SimConfig(block_size=BS, speedup=0))  # byte tokens
    await eng.start()
    try:
        whole = await collect(eng.generate(GenerateRequest("a", prompt, SamplingParams(max_tokens=60))))
        ids = [t for s in whole for t in s.token_ids]
        moved = GenerateRequest(
            "b", prompt + ids[:k], SamplingParams(max_tokens=60 - k), hints=Hints(resumed_tokens=k)
        )
        rest = await collect(eng.generate(moved))
        assert [t for s in rest for t in s.token_ids] == ids[k:]
    finally:
        await eng.stop()


async def test_push_mode_takes_the_same_steps_as_iteration(tokenizer: HFTokenizer) -> None:
    """`listen`/`take` (the worker's mux connection) give what `async for` gives, merged per take."""
    sim = engine(tokenizer)
    await sim.start()
    try:
        pulled = await collect(sim.generate(req("pull", max_tokens=40)))
        stream = sim.generate(req("push", max_tokens=40))
        calls = 0
        done = asyncio.Event()
        taken: list[Step] = []

        def ready() -> None:
            nonlocal calls
            calls += 1
            step = stream.take()
            if step is not None:
                taken.append(step)
                if step.finish_reason is not None:
                    done.set()

        stream.listen(ready)
        await asyncio.wait_for(done.wait(), 10)
        assert stream.take() is None  # the stream ended: nothing more
        assert "".join(s.text for s in taken) == "".join(s.text for s in pulled)
        assert sum(len(s.token_ids) for s in taken) == sum(len(s.token_ids) for s in pulled)
        assert calls >= len(taken) and taken[0].cached_tokens is not None
        pushed_usage, pulled_usage = taken[-1].usage, pulled[-1].usage
        assert pushed_usage is not None and pulled_usage is not None
        assert pushed_usage.output_tokens == pulled_usage.output_tokens
    finally:
        await sim.stop()


async def test_load_reports_the_host_tier(tokenizer: HFTokenizer) -> None:
    cfg = SimConfig(num_blocks=8, block_size=BS, speedup=0, host_blocks=16)
    eng = SimEngine(cfg, tokenizer)
    await eng.start()
    try:
        assert (eng.load().kv_host_blocks_used, eng.load().kv_host_blocks_total) == (0, 16)
        # Prompts that do not share a prefix push each other's blocks out of the 8 GPU blocks: to host.
        for i in range(4):
            await collect(eng.generate(req(f"r{i}", [1000 + i, *PROMPT[1:]], max_tokens=4)))
        load = eng.load()
        assert 0 < load.kv_host_blocks_used <= 16
    finally:
        await eng.stop()
