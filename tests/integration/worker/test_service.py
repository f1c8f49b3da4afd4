from __future__ import annotations

import asyncio
import json

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio
from worker_served import served

from agentserve.constraints.spec import Constraint
from agentserve.worker.client import WorkerClient, WorkerError
from agentserve.worker.engine import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    DuplicateRequestError,
    EngineNotReadyError,
    GenerateRequest,
    Hints,
    InvalidRequestError,
    KvEvent,
    SamplingParams,
    Step,
)
from agentserve.worker.engines.sim import SimConfig, SimEngine
from agentserve.worker.kvwire import decode_batch
from agentserve.worker.outputs import EchoPolicy, ScriptPolicy
from agentserve.worker.publisher import KvEventPublisher
from agentserve.worker.scheduler import SchedulerConfig
from agentserve.worker.tokenizer import HFTokenizer
from agentserve.worker.wire import StreamError

pytestmark = pytest.mark.anyio

BS = 4
PROMPT = list(range(1, 4 * BS + 3))
HINTS = Hints(turn=1, last_user_message="hello there", last_message="hello there")


def sim(tokenizer: HFTokenizer, speedup: float = 0, blocks: int = 512, policy: object = None) -> SimEngine:
    return SimEngine(SimConfig(num_blocks=blocks, block_size=BS, speedup=speedup), tokenizer, policy)  # type: ignore[arg-type]


def req(rid: str, prompt: list[int] = PROMPT, max_tokens: int = 200, **kw: object) -> GenerateRequest:
    return GenerateRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, **kw), hints=HINTS)  # type: ignore[arg-type]


def asgi_tasks() -> list[asyncio.Task[object]]:
    """uvicorn's per-request handler tasks still running in this loop."""
    return [t for t in asyncio.all_tasks() if "run_asgi" in repr(t.get_coro()) and not t.done()]


async def steps_of(client: WorkerClient, request: GenerateRequest) -> list[Step]:
    stream = await client.generate(request)
    return [s async for s in stream]


@pytest.mark.parametrize("framing", ["ndjson", "msgpack", "sse"])
@pytest.mark.parametrize("body", ["json", "msgpack"])
async def test_stream_over_http_matches_the_engine_in_process(
    tokenizer: HFTokenizer, framing: str, body: str
) -> None:
    local = sim(tokenizer)
    await local.start()
    expected = [s async for s in local.generate(req("a"))]
    await local.stop()
    async with served(sim(tokenizer)) as srv, WorkerClient(srv.url, framing=framing, body=body) as client:  # type: ignore[arg-type]
        steps = await steps_of(client, req("a"))
        assert "".join(s.text for s in steps) == "".join(s.text for s in expected)
        assert [t for s in steps for t in s.token_ids] == [t for s in expected for t in s.token_ids]
        assert steps[0].cached_tokens == 0
        assert steps[-1].finish_reason == "stop" and steps[-1].usage == expected[-1].usage
        again = await steps_of(client, req("b"))
        assert again[0].cached_tokens == 4 * BS


async def test_scripted_output_is_byte_exact_over_http(tokenizer: HFTokenizer) -> None:
    raw = (
        '<think>\nCall the tool — "quoted", tabs\tand ünïcödé 😀\n</think>\n\n'
        '<tool_call>\n{"name": "read", "arguments": {"path": "/tmp/a b.txt"}}\n</tool_call>'
    )
    policy = ScriptPolicy.from_mapping({"rules": [{"turn": 1, "output": raw}]}, EchoPolicy())
    for framing in ("ndjson", "msgpack", "sse"):
        async with (
            served(sim(tokenizer, policy=policy)) as srv,
            WorkerClient(srv.url, framing=framing) as client,
        ):  # type: ignore[arg-type]
            steps = await steps_of(client, req("a"))
            assert "".join(s.text for s in steps).encode() == raw.encode()


async def test_caller_disconnect_aborts_the_engine_request(tokenizer: HFTokenizer) -> None:
    engine = sim(tokenizer, speedup=50)
    async with served(engine) as srv, WorkerClient(srv.url, transport="http") as client:
        stream = await client.generate(req("long", max_tokens=100_000, ignore_eos=True))
        first = await stream.__anext__()
        assert first.token_ids
        assert engine.load().running == 1 and engine.load().kv_blocks_used > 0
        await stream.aclose()  # closes the HTTP connection mid-stream
        for _ in range(200):
            if engine.load().running == 0:
                break
            await asyncio.sleep(0.01)
        load = engine.load()
        assert (load.running, load.kv_blocks_used, load.requests_aborted) == (0, 0, 1)
        for _ in range(100):
            if not asgi_tasks():
                break
            await asyncio.sleep(0.01)
        assert not asgi_tasks()


async def test_disconnect_of_a_queued_request_aborts_it_too(tokenizer: HFTokenizer) -> None:
    config = SimConfig(num_blocks=512, block_size=BS, speedup=50, scheduler=SchedulerConfig(max_batch_size=1))
    engine = SimEngine(config, tokenizer)
    async with served(engine) as srv, httpx.AsyncClient() as http, WorkerClient(srv.url) as client:
        busy = await client.generate(req("busy", max_tokens=100_000, ignore_eos=True))
        body = json.dumps({"token_ids": [9, 9, 9], "sampling": {"max_tokens": 5}, "request_id": "queued"})
        async with http.stream("POST", srv.url + "/generate", content=body) as response:
            assert response.status_code == 200
            for _ in range(100):
                if engine.load().waiting == 1:
                    break
                await asyncio.sleep(0.01)
            assert engine.load().waiting == 1
        # Leaving the block closed the connection before any token came.
        for _ in range(200):
            if engine.load().waiting == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.load().waiting == 0 and engine.load().requests_aborted == 1
        await busy.aclose()


async def test_without_request_abort_the_engine_finishes_unread_requests(tokenizer: HFTokenizer) -> None:
    engine = sim(tokenizer, speedup=200)
    async with served(engine, request_abort=False) as srv, WorkerClient(srv.url, transport="http") as client:
        stream = await client.generate(req("a", max_tokens=60, ignore_eos=True))
        await stream.__anext__()
        await stream.aclose()
        for _ in range(300):
            if engine.load().requests_finished == 1:
                break
            await asyncio.sleep(0.01)
        assert engine.load().requests_finished == 1 and engine.load().requests_aborted == 0
        # The server's handler drained the stream and ended (no handler left waiting forever).
        for _ in range(100):
            if not asgi_tasks():
                break
            await asyncio.sleep(0.01)
        assert not asgi_tasks()


async def test_bad_requests_get_json_errors_with_the_right_status(tokenizer: HFTokenizer) -> None:
    # Slow time (0.02 simulated s per real s): "dup" must still be running when its twin arrives;
    # at 50x it could use up its 8 blocks and finish first on a loaded machine.
    engine = sim(tokenizer, speedup=0.02, blocks=8)
    async with served(engine) as srv, httpx.AsyncClient(base_url=srv.url) as http:
        cases = [
            (b"{not json", "application/json", 400),
            (b"[]", "application/json", 400),
            (json.dumps({"token_ids": [1, -2], "sampling": {"max_tokens": 4}}).encode(), None, 400),
            (json.dumps({"token_ids": [1], "sampling": {}}).encode(), None, 400),
            (json.dumps({"token_ids": list(range(200)), "sampling": {"max_tokens": 4}}).encode(), None, 400),
            (json.dumps({"token_ids": [], "sampling": {"max_tokens": 4}}).encode(), None, 400),
            (b"\xc1", "application/x-msgpack", 400),
            (b"x", "text/plain", 400),
        ]
        for body, ctype, status in cases:
            headers = {"content-type": ctype} if ctype else {}
            r = await http.post("/generate", content=body, headers=headers)
            assert r.status_code == status, (body, r.text)
            assert set(r.json()["error"]) == {"type", "message"}
        r = await http.get("/nope")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
        r = await http.get("/generate")
        assert r.status_code == 405 and "error" in r.json()
        client = WorkerClient(srv.url)
        stream = await client.generate(req("dup", [1, 2], max_tokens=10_000, ignore_eos=True))
        with pytest.raises(DuplicateRequestError):
            await client.generate(req("dup", [1, 2]))
        with pytest.raises(InvalidRequestError, match="KV blocks"):
            await client.generate(req("big", list(range(100))))
        await stream.aclose()
        await client.aclose()


async def test_health_ready_load_info_and_metrics(tokenizer: HFTokenizer) -> None:
    engine = sim(tokenizer)
    async with served(engine, model="m1") as srv, WorkerClient(srv.url) as client:
        assert await client.health() and await client.ready()
        await steps_of(client, req("a"))
        await steps_of(client, req("b"))
        load = await client.load()
        assert load.requests_finished == 2 and load.cached_prompt_tokens == 4 * BS
        info = await client.info()
        assert info["block_size"] == BS and info["engine"] == "sim" and info["model"] == "m1"
        async with httpx.AsyncClient() as http:
            text = (await http.get(srv.url + "/metrics")).text
        metrics = {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("agentserve_worker_")
        }
        assert metrics["agentserve_worker_requests_running"] == 0
        assert metrics["agentserve_worker_kv_blocks_capacity"] == 512
        assert metrics["agentserve_worker_prompt_tokens_total"] == 2 * len(PROMPT)
        assert metrics["agentserve_worker_prefix_cache_hit_rate"] == pytest.approx(16 / 36)
        assert metrics["agentserve_worker_generation_tokens_total"] == load.generated_tokens
        assert "agentserve_worker_generation_tokens_per_second" in metrics
        assert 'model="m1"' in text
        assert metrics["agentserve_worker_constrained_requests_total"] == 0
        assert "process_cpu_seconds_total" in text  # what the constraint CPU is a share of


async def test_metrics_count_constrained_requests_and_the_cpu_their_constraints_took(
    tokenizer: HFTokenizer,
) -> None:
    engine = sim(tokenizer)

    async def scrape(http: httpx.AsyncClient, url: str) -> dict[str, float]:
        text = (await http.get(url + "/metrics")).text
        return {
            line.split("{")[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("agentserve_worker_constrain")
        }

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    constraint = Constraint(f"start: %json{json.dumps(schema)}\n", schema)
    async with served(engine) as srv, WorkerClient(srv.url) as client, httpx.AsyncClient() as http:
        await steps_of(client, req("plain"))
        before = await scrape(http, srv.url)
        assert before == {
            "agentserve_worker_constrained_requests_total": 0,
            "agentserve_worker_constraint_cpu_seconds_total": 0,
        }
        request = GenerateRequest(
            "c", PROMPT, SamplingParams(max_tokens=64), hints=HINTS, constraint=constraint
        )
        text = tokenizer.decode([t for s in await steps_of(client, request) for t in s.token_ids])
        assert json.loads(text.removesuffix("<|im_end|>")) in ({"ok": True}, {"ok": False})
        after = await scrape(http, srv.url)
        assert after["agentserve_worker_constrained_requests_total"] == 1
        assert after["agentserve_worker_constraint_cpu_seconds_total"] > 0  # the grammar compiled, at least


class _SlowEngine(SimEngine):
    async def start(self) -> None:
        await asyncio.sleep(0.3)
        await super().start()


async def test_ready_waits_for_the_model_while_health_is_live(tokenizer: HFTokenizer) -> None:
    engine = _SlowEngine(SimConfig(block_size=BS, speedup=0), tokenizer)
    async with served(engine) as srv, WorkerClient(srv.url) as client:
        assert await client.health()
        assert not await client.ready()
        with pytest.raises(EngineNotReadyError):
            await client.generate(req("a"))
        for _ in range(100):
            if await client.ready():
                break
            await asyncio.sleep(0.02)
        assert await client.ready()


async def test_client_reports_unreachable_workers() -> None:
    async with WorkerClient("http://127.0.0.1:9") as client:
        assert not await client.health()
        with pytest.raises(WorkerError, match="connection_error"):
            await client.generate(GenerateRequest("a", [1], SamplingParams(max_tokens=1)))


async def test_error_frames_become_stream_errors(tokenizer: HFTokenizer) -> None:
    class Failing(SimEngine):
        def generate(self, request: GenerateRequest):  # type: ignore[no-untyped-def]
            inner = super().generate(request)

            class Boom:
                def __aiter__(self):  # type: ignore[no-untyped-def]
                    return self

                async def __anext__(self) -> Step:
                    from agentserve.worker.engine import EngineError

                    raise EngineError("GPU fell off the bus")

                async def aclose(self) -> None:
                    await inner.aclose()

            return Boom()

    async with (
        served(Failing(SimConfig(block_size=BS, speedup=0), tokenizer)) as srv,
        WorkerClient(srv.url) as c,
    ):
        stream = await c.generate(req("a"))
        with pytest.raises(StreamError, match="GPU fell off the bus"):
            await stream.__anext__()


async def test_kv_events_reach_a_real_zmq_subscriber_in_order_without_gaps(tokenizer: HFTokenizer) -> None:
    publisher = KvEventPublisher("tcp://127.0.0.1:0")
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(publisher.endpoint)
    await asyncio.sleep(0.3)  # let the subscription reach the publisher before anything is sent
    engine = sim(tokenizer, blocks=24)
    received: list[KvEvent] = []
    try:
        async with served(engine, publisher=publisher) as srv, WorkerClient(srv.url) as client:
            for i in range(25):
                prompt = [i * 1000 + t for t in range(3 * BS + 1)]
                await steps_of(client, req(f"r{i}", prompt, max_tokens=2 * BS, ignore_eos=True))
            last = engine.kv_snapshot().seq
            while not received or received[-1].seq < last:
                frames = await asyncio.wait_for(sub.recv_multipart(), 5)
                assert frames[0] == b"kv"
                received += decode_batch(frames)
            snapshot = await client.kv_snapshot()
        assert isinstance(received[0], AllCleared)
        assert [e.seq for e in received] == list(range(1, last + 1))
        assert any(isinstance(e, BlockRemoved) for e in received)  # the cache was under pressure
        held: set[int] = set()
        for e in received:
            if isinstance(e, BlockStored):
                held.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                held.difference_update(e.block_hashes)
        assert snapshot.seq == last and set(snapshot.block_hashes) == held
    finally:
        sub.close(0)
        ctx.term()


async def test_msgpack_request_bodies_are_accepted_raw(tokenizer: HFTokenizer) -> None:
    async with served(sim(tokenizer)) as srv, httpx.AsyncClient() as http:
        body = msgpack.packb({"token_ids": PROMPT, "sampling": {"max_tokens": 3}})
        r = await http.post(
            srv.url + "/generate",
            content=body,
            headers={"content-type": "application/x-msgpack", "accept": "application/x-ndjson"},
        )
        lines = [json.loads(line) for line in r.text.splitlines()]
        assert r.headers["content-type"] == "application/x-ndjson"
        assert r.headers["x-request-id"]
        assert lines[-1]["finish_reason"] == "length" and lines[-1]["usage"]["output_tokens"] == 3


async def test_the_publisher_coalesces_per_step_batches_into_fewer_messages() -> None:
    from agentserve.worker.events import EventHub

    publisher = KvEventPublisher("tcp://127.0.0.1:0", coalesce_s=0.05, heartbeat_s=None)
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(publisher.endpoint)
    await asyncio.sleep(0.3)
    hub = EventHub()
    task = asyncio.create_task(publisher.run(hub.subscribe()))
    try:
        for seq in range(1, 21):  # 20 engine steps, one batch each, a loop pass apart
            hub.publish([BlockStored(seq, (seq,), None, BS)])
            await asyncio.sleep(0)
        received: list[KvEvent] = []
        while len(received) < 20:
            received += decode_batch(await asyncio.wait_for(sub.recv_multipart(), 5))
        assert [e.seq for e in received] == list(range(1, 21))  # every event, in order
        assert publisher.events_published == 20 and publisher.messages_published < 5
    finally:
        hub.close()
        await task
        publisher.close()
        sub.close(0)
        ctx.term()
