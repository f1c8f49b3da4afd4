"""Many generate streams on one worker connection (`POST /generate/mux`): the same steps as the
per-request path, one connection, cancellation of one stream, the connection's death, drain."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from test_service import PROMPT, asgi_tasks, req, sim, steps_of
from worker_served import served

from agentserve.drain import DrainState
from agentserve.worker.client import MuxStepStream, RemoteStepStream, WorkerClient, WorkerError
from agentserve.worker.engine import DuplicateRequestError, InvalidRequestError
from agentserve.worker.tokenizer import HFTokenizer

pytestmark = pytest.mark.anyio


async def _wait(cond: object, tries: int = 300) -> None:
    for _ in range(tries):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)


async def test_concurrent_streams_share_one_connection_and_match_the_http_path(
    tokenizer: HFTokenizer,
) -> None:
    engine = sim(tokenizer)
    async with (
        served(engine) as srv,
        WorkerClient(srv.url) as mux,
        WorkerClient(srv.url, transport="http") as http,
    ):
        requests = [req(f"m{i}", prompt=[*PROMPT, i], max_tokens=40 + i) for i in range(16)]
        via_mux = await asyncio.gather(*(steps_of(mux, r) for r in requests))
        assert srv.server is not None
        assert len(srv.server.server_state.connections) == 1  # all 16 streams on one connection
        via_http = await asyncio.gather(
            *(steps_of(http, req(f"h{i}", prompt=[*PROMPT, i], max_tokens=40 + i)) for i in range(16))
        )
        for m, h in zip(via_mux, via_http, strict=True):
            assert "".join(s.text for s in m) == "".join(s.text for s in h)
            assert sum(len(s.token_ids) for s in m) == sum(len(s.token_ids) for s in h)
            mu, hu = m[-1].usage, h[-1].usage
            assert mu is not None and hu is not None and m[-1].finish_reason == h[-1].finish_reason
            assert (mu.input_tokens, mu.output_tokens) == (hu.input_tokens, hu.output_tokens)


async def test_cancelling_one_stream_aborts_only_it(tokenizer: HFTokenizer) -> None:
    engine = sim(tokenizer, speedup=50)
    async with served(engine) as srv, WorkerClient(srv.url) as client:
        streams = [await client.generate(req(f"s{i}", max_tokens=100_000, ignore_eos=True)) for i in range(3)]
        assert all(isinstance(s, MuxStepStream) for s in streams)
        for s in streams:
            assert (await s.__anext__()).token_ids
        await streams[1].aclose()
        await _wait(lambda: engine.load().requests_aborted == 1)
        assert engine.load().requests_aborted == 1 and engine.load().running == 2
        for s in (streams[0], streams[2]):  # the others go on, on the same connection
            assert (await s.__anext__()).token_ids
        with pytest.raises(StopAsyncIteration):
            await streams[1].__anext__()
        for s in (streams[0], streams[2]):
            await s.aclose()
        await _wait(lambda: engine.load().running == 0)
        assert engine.load().requests_aborted == 3 and engine.load().kv_blocks_used == 0


async def test_a_dead_connection_ends_every_stream_on_it_and_the_next_request_reconnects(
    tokenizer: HFTokenizer,
) -> None:
    engine = sim(tokenizer, speedup=50)
    async with served(engine) as srv, WorkerClient(srv.url) as client:
        streams = [await client.generate(req(f"d{i}", max_tokens=100_000, ignore_eos=True)) for i in range(4)]
        for s in streams:
            await s.__anext__()
        assert srv.cut_connections() == 1
        for s in streams:
            with pytest.raises(WorkerError) as info:
                while True:
                    await s.__anext__()
            assert info.value.status is None and info.value.kind == "connection_error"
        # The worker aborted them all (the router would migrate them elsewhere).
        await _wait(lambda: engine.load().running == 0)
        assert engine.load().requests_aborted == 4 and engine.load().kv_blocks_used == 0
        steps = await steps_of(client, req("after", max_tokens=5))
        assert steps[-1].usage is not None and steps[-1].usage.output_tokens == 5


async def test_refusals_map_to_the_engine_errors(tokenizer: HFTokenizer) -> None:
    engine = sim(tokenizer, speedup=50)
    async with served(engine) as srv, WorkerClient(srv.url) as client:
        long = await client.generate(req("dup", max_tokens=100_000, ignore_eos=True))
        with pytest.raises(DuplicateRequestError):
            await client.generate(req("dup"))
        with pytest.raises(InvalidRequestError):
            await client.generate(req("empty", prompt=[]))
        # The refused opens did not disturb the stream already running.
        assert (await long.__anext__()).token_ids
        await long.aclose()


async def test_without_request_abort_a_cancelled_stream_runs_to_its_end(tokenizer: HFTokenizer) -> None:
    engine = sim(tokenizer, speedup=200)
    async with served(engine, request_abort=False) as srv, WorkerClient(srv.url) as client:
        stream = await client.generate(req("a", max_tokens=60, ignore_eos=True))
        await stream.__anext__()
        await stream.aclose()
        await _wait(lambda: engine.load().requests_finished == 1)
        assert engine.load().requests_finished == 1 and engine.load().requests_aborted == 0
        assert (await steps_of(client, req("b", max_tokens=3)))[-1].finish_reason == "length"


async def test_a_draining_worker_refuses_new_streams_and_ends_the_idle_connection(
    tokenizer: HFTokenizer,
) -> None:
    engine = sim(tokenizer, speedup=50)
    drain = DrainState()
    async with served(engine, drain=drain) as srv, WorkerClient(srv.url) as client:
        running = await client.generate(req("r", max_tokens=30, ignore_eos=True))
        drain.start()
        with pytest.raises(WorkerError) as info:
            await client.generate(req("late"))
        assert info.value.status == 503
        steps = [s async for s in running]  # the stream already running finishes
        assert steps[-1].finish_reason == "length"
        await _wait(lambda: not asgi_tasks())
        assert not asgi_tasks()  # the worker ended the mux exchange once it had no stream


async def test_a_worker_without_the_mux_route_is_served_per_request() -> None:
    async def gone(request: object) -> JSONResponse:
        return JSONResponse({"error": {"type": "not_found", "message": "no"}}, status_code=404)

    app = Starlette(routes=[Route("/generate/mux", gone, methods=["POST"])])

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    await _wait(lambda: server.started)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with WorkerClient(f"http://127.0.0.1:{port}") as client:
            with pytest.raises(WorkerError) as info:
                await client.generate(req("x"))
            # It fell back to POST /generate (which this app does not have either: 404).
            assert info.value.status == 404 and client.transport == "http"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_http_transport_stays_per_request(tokenizer: HFTokenizer) -> None:
    async with served(sim(tokenizer)) as srv, WorkerClient(srv.url, transport="http") as client:
        stream = await client.generate(req("h", max_tokens=3))
        assert isinstance(stream, RemoteStepStream)
        assert [s async for s in stream][-1].usage is not None


async def test_closing_a_stream_ends_a_read_pending_on_it(tokenizer: HFTokenizer) -> None:
    """The router interrupts the streams of a worker it declared dead by closing them."""
    engine = sim(tokenizer, speedup=0.0001)  # the first step is hours away
    async with served(engine) as srv, WorkerClient(srv.url) as client:
        stream = await client.generate(req("slow", max_tokens=5))
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        assert not pending.done()
        await stream.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(pending, 5)
        await _wait(lambda: engine.load().requests_aborted == 1)
        assert engine.load().requests_aborted == 1


async def test_streams_without_push_mode_get_a_consumer_each(tokenizer: HFTokenizer) -> None:
    """Engines whose streams only iterate (TensorRT-LLM's) go through the per-stream pump."""
    from agentserve.worker.engines.sim import SimEngine

    class PullOnly(SimEngine):
        def generate(self, request):  # type: ignore[no-untyped-def]
            inner = super().generate(request)

            class Stream:  # no listen/take
                def __aiter__(self):  # type: ignore[no-untyped-def]
                    return self

                async def __anext__(self):  # type: ignore[no-untyped-def]
                    return await inner.__anext__()

                async def aclose(self) -> None:
                    await inner.aclose()

            return Stream()

    base = sim(tokenizer, speedup=50)
    pull = PullOnly(base.config, tokenizer)
    async with served(pull) as srv, WorkerClient(srv.url) as client:
        results = await asyncio.gather(
            *(steps_of(client, req(f"p{i}", prompt=[*PROMPT, i], max_tokens=30)) for i in range(8))
        )
        for steps in results:
            usage = steps[-1].usage
            assert usage is not None and usage.output_tokens == sum(len(s.token_ids) for s in steps)
            assert steps[0].cached_tokens is not None
        long = await client.generate(req("cancel-me", max_tokens=100_000, ignore_eos=True))
        await long.__anext__()
        await long.aclose()
        await _wait(lambda: pull.load().requests_aborted == 1)
        assert pull.load().requests_aborted == 1
