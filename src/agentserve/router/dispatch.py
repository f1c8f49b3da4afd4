"""Generating a request on a routed worker, with failover: the frontend's one call into the backend.

`Dispatcher.generate` asks the router for a worker, opens the stream there, and hands back a
`DispatchedStream` of engine `Step`s. If the worker fails before the first token was streamed, the
worker is reported to the router (which purges it) and the request is retried elsewhere. Once
tokens went out, the request *migrates* (as Dynamo's request migration does): it is re-dispatched
to another worker with the prompt plus every token already generated and a budget cut by as many,
and its steps continue where the dead worker's ended, so the consumer sees no seam; the finish
step's usage counts the output once. Past `max_migrations` a failure ends the stream with
`WorkerLostError`, which the API layer turns into its own error event. When the stream ends,
however it ends, the router is told so its load accounting stays right.

Workers are reached through `WorkerTransport`s: an in-process engine (`EngineTransport`) or a
`WorkerClient` over HTTP (`ClientTransport`), chosen by the deployment, invisible to the frontend.

Disaggregated prefill: when the router's decision says `prefill.where == "remote"`, the prompt is
first sent to the chosen prefill worker as a context-only request (one token; the worker holds the
prompt's KV), then to the decode worker with the `KvTransfer` its last step named, which pulls the
KV instead of prefilling. A prefill worker that fails (or holds nothing) is reported like any
failed worker and the decode worker prefills locally; a pull that fails is the decode worker's to
absorb (it prefills locally and says so with `received_tokens` 0). Either way the client sees one
ordinary stream; `DispatchedStream.prefill` records what was decided and what happened.

Speculative prefill (`agent_hints.speculative_prefill`): once a turn is done, the frontend hands
`Dispatcher.speculative_prefill` the predicted next prompt (this prompt + the output + whatever
the template adds before the next message). It is routed like the next turn will be (same
session, so same worker while the prefix is there) and generated with `max_tokens=1` at the
lowest priority: its prefill lands in that worker's KV cache while the agent runs its tools, and
it never delays a real request (it waits behind them in the router's queue and the engine's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from agentserve.conversation import Usage
from agentserve.router.core import OverloadedError, Router
from agentserve.router.disagg import PrefillPlan
from agentserve.router.placement import Decision, NoWorkerError, RouteRequest
from agentserve.worker.engine import (
    Engine,
    EngineError,
    GenerateRequest,
    Hints,
    InvalidRequestError,
    KvTransfer,
    Retention,
    SamplingParams,
    Step,
    StepStream,
)

log = logging.getLogger(__name__)

WARM_PRIORITY = -(2**31)  # the lowest priority: a warm-up yields to every real request


class WorkerTransport(Protocol):
    async def open(self, request: GenerateRequest) -> StepStream: ...


class EngineTransport:
    """A worker that is an engine in this process."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def open(self, request: GenerateRequest) -> StepStream:
        return self.engine.generate(request)


class _Client(Protocol):
    async def generate(self, request: GenerateRequest) -> StepStream: ...


class ClientTransport:
    """A worker reached over the network (`agentserve.worker.client.WorkerClient`)."""

    def __init__(self, client: _Client) -> None:
        self.client = client

    @property
    def address(self) -> str:
        """Where a decode worker pulls KV this worker holds (its URL)."""
        return str(getattr(self.client, "base_url", ""))

    async def open(self, request: GenerateRequest) -> StepStream:
        return await self.client.generate(request)


class WorkerLostError(RuntimeError):
    """The worker failed after output was already streamed: the request cannot be retried."""


class NoCapacityError(RuntimeError):
    """No worker could take the request (none registered, or every attempt failed)."""


# Failures that mean "this worker is gone", as opposed to "this request is bad".
_WORKER_FAILURES: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    EngineError,
    asyncio.TimeoutError,
)


@dataclass(slots=True)
class Attempt:
    worker: str
    error: str


@dataclass(slots=True)
class PrefillOutcome:
    """Where the prompt was prefilled: the router's plan and what happened to it."""

    plan: PrefillPlan
    # local (as planned) | remote | prefill-failed (the prefill worker failed or held nothing:
    # prefilled locally) | transfer-failed (the decode worker could not pull: prefilled locally)
    outcome: str
    prefill_s: float | None = None  # measured: the context-only request on the prefill worker
    received_tokens: int | None = None  # prompt tokens whose KV the decode worker pulled


@dataclass(slots=True)
class Migration:
    """A stream moved off a worker that died mid-stream."""

    from_worker: str
    to_worker: str
    resumed_tokens: int  # output tokens already streamed, re-sent as prompt (extra prefill)
    failed_at: float  # time.monotonic() when the failure was seen
    first_token_at: float | None = None  # the new worker's first output token

    @property
    def gap_s(self) -> float | None:
        """Failure → first migrated token (the client's visible stall)."""
        return None if self.first_token_at is None else self.first_token_at - self.failed_at


class DispatchedStream:
    """Steps of one request, on whichever worker ended up serving it."""

    def __init__(self, dispatcher: Dispatcher, request: GenerateRequest, route: RouteRequest) -> None:
        self._dispatcher = dispatcher
        self._request = request
        self._original = request
        self._route = route
        self._resumed = 0  # output tokens streamed before the current worker took over
        self.migrations: list[Migration] = []
        self._stream: StepStream | None = None
        self._decision: Decision | None = None
        self._previous: Decision | None = None  # the dead worker's, while a migration opens
        self._streamed = False
        self._closed = False
        self._interrupted = False
        self._worker: str | None = None  # the worker being opened or streaming (for interrupts)
        self._opening: asyncio.Future[StepStream] | None = None
        self.attempts: list[Attempt] = []
        self.output_token_ids: list[int] = []  # everything streamed so far (the next turn's prefix)
        self.cached_tokens: int | None = None  # prompt tokens the serving worker had cached
        self.prefill: PrefillOutcome | None = None  # set when prefill workers exist

    @property
    def decision(self) -> Decision:
        decision = self._decision or self._previous
        if decision is None:
            raise RuntimeError("the stream is not open yet")
        return decision

    async def open(self) -> None:
        """Route and open the stream (retrying on other workers); raises NoCapacityError."""
        exclude = {a.worker for a in self.attempts}
        for _ in range(self._dispatcher.max_attempts):
            try:
                decision = await self._dispatcher.router.route(self._route, frozenset(exclude))
            except NoWorkerError as exc:
                raise NoCapacityError(self._failure_summary(str(exc))) from exc
            transport = self._dispatcher.workers().get(decision.worker)
            if transport is None:
                await self._fail_worker(decision, exclude, "worker is not registered")
                continue
            self._track(decision.worker)
            request = self._request
            if decision.dp_rank is not None or request.dp_rank is not None:
                # The attention-DP rank whose cache the router chose: the worker pins it there.
                request = replace(request, dp_rank=decision.dp_rank)
            if decision.prefill is not None:
                try:
                    request = await self._prefill(decision, decision.prefill, request)
                except BaseException:  # cancelled (the client left): the decode worker's load ends too
                    self._track(None)
                    await asyncio.shield(self._dispatcher.router.finish(decision))
                    raise
            # A task, so that `interrupt` can end an open a hung worker never answers.
            self._opening = asyncio.ensure_future(transport.open(request))
            try:
                self._stream = await self._opening
            except InvalidRequestError:
                self._track(None)
                await self._dispatcher.router.finish(decision)
                raise
            except _WORKER_FAILURES as exc:
                await self._fail_worker(decision, exclude, repr(exc))
                continue
            except asyncio.CancelledError:
                if not self._interrupted:
                    self._track(None)
                    raise  # our caller was cancelled (the task was cancelled with us)
                self._interrupted = False
                await self._fail_worker(decision, exclude, "the router declared the worker dead")
                continue
            finally:
                self._opening = None
            self._decision = decision
            return
        raise NoCapacityError(self._failure_summary("every attempt failed"))

    async def _prefill(
        self, decision: Decision, plan: PrefillPlan, request: GenerateRequest
    ) -> GenerateRequest:
        """Run a remote prefill and return the decode worker's request (carrying the KV transfer),
        or `request` unchanged to prefill locally (as planned, or because the prefill failed)."""
        worker = plan.prefill_worker
        if plan.where != "remote" or worker is None:
            self.prefill = PrefillOutcome(plan, "local")
            return request
        dispatcher = self._dispatcher
        transport = dispatcher.workers().get(worker)
        started = time.monotonic()
        transfer: KvTransfer | None = None
        failure: str | None = None
        context = replace(
            request,
            request_id=f"{request.request_id}-prefill",
            sampling=replace(request.sampling, max_tokens=1),
            context_only=True,
            kv_transfer=None,
            dp_rank=None,
            constraint=None,  # one token, discarded: the decode worker samples under the constraint
        )
        try:
            if transport is None:
                raise ConnectionError("the prefill worker is not registered")
            stream = await transport.open(context)
            try:
                async for step in stream:
                    if step.kv_transfer is not None:
                        transfer = step.kv_transfer
            finally:
                with contextlib.suppress(*_WORKER_FAILURES):
                    await stream.aclose()
        except InvalidRequestError as exc:  # the decode worker will say so, or serve it
            transfer, failure = None, repr(exc)
        except _WORKER_FAILURES as exc:
            transfer, failure = None, repr(exc)
            log.warning(
                "prefill worker %s failed (%s); prefilling %s locally", worker, failure, request.request_id
            )
            await dispatcher.router.worker_failed(worker)
            dispatcher.on_worker_failed(worker)
        finally:
            if plan.ticket is not None:  # its load ends with its prefill, not with the stream
                await dispatcher.router.finish(
                    replace(decision, worker=worker, ticket=plan.ticket, prefill=None)
                )
        elapsed = time.monotonic() - started
        if transfer is None or transfer.tokens <= 0:
            self.prefill = PrefillOutcome(plan, "prefill-failed", elapsed)
            return request
        self.prefill = PrefillOutcome(plan, "remote", elapsed)
        source = getattr(transport, "address", worker) or worker
        return replace(request, kv_transfer=replace(transfer, source=source, seconds=plan.transfer_s))

    def __aiter__(self) -> AsyncIterator[Step]:
        return self._steps()

    async def _steps(self) -> AsyncIterator[Step]:
        if self._stream is None:
            await self.open()
        try:
            while True:
                assert self._stream is not None
                failure: BaseException | None = None
                try:
                    step = await self._stream.__anext__()
                except StopAsyncIteration:
                    if not self._interrupted:
                        return
                    failure = ConnectionAbortedError("the router declared the worker dead")
                except InvalidRequestError:
                    raise
                except _WORKER_FAILURES as exc:
                    failure = exc
                if failure is not None:
                    if self._streamed:
                        if len(self.migrations) >= self._dispatcher.max_migrations:
                            await self._dispatcher.router.worker_failed(self.decision.worker)
                            raise WorkerLostError(
                                f"worker {self.decision.worker} failed mid-stream: {failure!r}"
                            ) from failure
                        last = await self._migrate(failure)
                        if last is not None:  # the budget was spent: nothing left to generate
                            yield last
                            return
                        continue
                    # Nothing reached the client yet: retry transparently on another worker.
                    exclude = {a.worker for a in self.attempts}
                    await self._fail_worker(self.decision, exclude, repr(failure))
                    self._stream = None
                    self._interrupted = False
                    await self.open()
                    continue
                prefill = self.prefill  # None unless the fleet has prefill workers
                if prefill is not None and step.received_tokens is not None:
                    prefill.received_tokens = step.received_tokens
                    if step.received_tokens == 0 and prefill.outcome == "remote":
                        prefill.outcome = "transfer-failed"  # the decode worker prefilled it
                if step.token_ids or step.text:
                    self._streamed = True
                    self.output_token_ids += step.token_ids
                if self._resumed:
                    step = self._continued(step)
                elif step.cached_tokens is not None:
                    self.cached_tokens = step.cached_tokens
                yield step
                if step.finish_reason is not None:
                    return
        finally:
            await self.aclose()

    async def _migrate(self, failure: BaseException) -> Step | None:
        """Re-dispatch to another worker with the prompt + the output so far. Returns a finish
        step instead when the output budget is already spent. Raises WorkerLostError when no
        other worker can take it."""
        failed = self.decision.worker
        failed_at = time.monotonic()
        log.warning(
            "worker %s failed mid-stream (%r); migrating %s", failed, failure, self._original.request_id
        )
        self._track(None)
        self.attempts.append(Attempt(failed, repr(failure)))
        await self._dispatcher.router.finish(self.decision)
        self._previous, self._decision = self._decision, None
        await self._dispatcher.router.worker_failed(failed)
        self._dispatcher.on_worker_failed(failed)
        if self._stream is not None:
            with contextlib.suppress(*_WORKER_FAILURES):
                await self._stream.aclose()
        self._stream = None
        self._interrupted = False
        base = self._original
        done = len(self.output_token_ids)
        remaining = base.sampling.max_tokens - done
        if remaining < 1:
            usage = Usage(len(base.prompt_token_ids), done, self.cached_tokens or 0)
            return Step((), "", finish_reason="length", usage=usage)
        self._request = replace(
            base,
            request_id=f"{base.request_id}-m{len(self.migrations) + 1}",
            prompt_token_ids=[*base.prompt_token_ids, *self.output_token_ids],
            sampling=replace(base.sampling, max_tokens=remaining),
            hints=replace(base.hints or Hints(), resumed_tokens=done),
        )
        self._route = replace(self._route, prompt_tokens=len(self._request.prompt_token_ids))
        try:
            await self.open()
        except NoCapacityError as exc:
            raise WorkerLostError(
                f"worker {failed} failed mid-stream and no worker took it over: {exc}"
            ) from failure
        self._resumed = done
        self.migrations.append(Migration(failed, self.decision.worker, done, failed_at))
        return None

    def _continued(self, step: Step) -> Step:
        """A step of a migrated request as the original request's: its first output token is
        timed, its cached-prompt count dropped, its usage counts all output once."""
        migration = self.migrations[-1]
        if migration.first_token_at is None and step.token_ids:
            migration.first_token_at = time.monotonic()
        usage = step.usage
        if usage is not None:
            base = self._original
            usage = Usage(
                len(base.prompt_token_ids),
                usage.output_tokens + self._resumed,
                self.cached_tokens or 0,
                usage.reasoning_tokens,
            )
        if step.cached_tokens is None and usage is step.usage:
            return step
        return replace(step, cached_tokens=None, usage=usage)

    def interrupt(self) -> None:
        """End the stream as if its worker failed now (it is hung: nothing else would end it)."""
        if self._closed or self._interrupted:
            return
        opening, stream = self._opening, self._stream
        if opening is not None and not opening.done():
            self._interrupted = True
            opening.cancel()
            return
        if stream is None and opening is not None and not opening.cancelled() and not opening.exception():
            stream = opening.result()  # opened, but `open` has not resumed to take it yet
        if stream is not None:
            self._interrupted = True
            task = asyncio.get_running_loop().create_task(stream.aclose())  # wakes the pending read
            self._dispatcher._closing.add(task)
            task.add_done_callback(self._dispatcher._closing.discard)

    def _track(self, worker: str | None) -> None:
        open_ = self._dispatcher._open
        if self._worker is not None:
            streams = open_.get(self._worker)
            if streams is not None:
                streams.discard(self)
                if not streams:
                    del open_[self._worker]
        self._worker = worker
        if worker is not None:
            open_.setdefault(worker, set()).add(self)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._track(None)
        if self._stream is not None:
            with contextlib.suppress(*_WORKER_FAILURES):
                await self._stream.aclose()  # aborts the engine request if it is still running
        if self._decision is not None:
            await self._dispatcher.router.finish(self._decision)

    async def _fail_worker(self, decision: Decision, exclude: set[str], error: str) -> None:
        log.warning("worker %s failed before streaming (%s); retrying elsewhere", decision.worker, error)
        self._track(None)
        self.attempts.append(Attempt(decision.worker, error))
        exclude.add(decision.worker)
        await self._dispatcher.router.finish(decision)
        await self._dispatcher.router.worker_failed(decision.worker)
        self._dispatcher.on_worker_failed(decision.worker)

    def _failure_summary(self, reason: str) -> str:
        tried = ", ".join(f"{a.worker} ({a.error})" for a in self.attempts)
        return f"{reason}; tried: {tried}" if tried else reason


_WARM_FAILURES: tuple[type[BaseException], ...] = (
    NoCapacityError,
    OverloadedError,
    WorkerLostError,
    InvalidRequestError,
    *_WORKER_FAILURES,
)


@dataclass(frozen=True, slots=True)
class Warmed:
    worker: str
    cached_tokens: int  # of the warm-up's prompt, already cached before it ran


class Dispatcher:
    def __init__(
        self,
        router: Router,
        workers: Callable[[], Mapping[str, WorkerTransport]],
        *,
        max_attempts: int = 3,
        max_migrations: int = 3,
        on_worker_failed: Callable[[str], None] = lambda worker: None,
        max_warming: int = 64,
    ) -> None:
        self.router = router
        self.workers = workers  # current transports by worker id (discovery may change them)
        self.max_attempts = max_attempts
        self.max_migrations = max_migrations  # re-dispatches of one stream after mid-stream failures
        self.on_worker_failed = on_worker_failed
        self.max_warming = max_warming  # speculative prefills in flight beyond which new ones are skipped
        self._warming: set[asyncio.Task[Warmed | None]] = set()
        self._open: dict[str, set[DispatchedStream]] = {}  # worker -> its open streams
        self._closing: set[asyncio.Task[None]] = set()

    async def generate(self, request: GenerateRequest, route: RouteRequest) -> DispatchedStream:
        """Route and open `request`; iterate the result for steps. Raises NoCapacityError."""
        stream = DispatchedStream(self, request, route)
        await stream.open()
        return stream

    def interrupt(self, worker: str) -> int:
        """The router declared `worker` dead (hung or silent): end its streams now. Those that
        streamed nothing yet are retried elsewhere, the others end with `WorkerLostError`."""
        streams = list(self._open.get(worker, ()))
        for stream in streams:
            stream.interrupt()
        return len(streams)

    # -- speculative prefill -----------------------------------------------------------------------

    async def warm(
        self, prompt_token_ids: Sequence[int], route: RouteRequest, retention: Retention | None = None
    ) -> Warmed | None:
        """Prefill `prompt_token_ids` where `route` leads, at the lowest priority, one output token.
        `retention`: what its blocks are released under (the session's own: a warm-up releases them
        last, and the last release decides their class, so without it a warm-up would demote them).

        None when it could not run (no capacity, a worker lost): a warm-up is only a hint.
        """
        request = GenerateRequest(
            f"warm-{uuid.uuid4().hex}",
            prompt_token_ids,
            SamplingParams(max_tokens=1),
            priority=WARM_PRIORITY,
            retention=retention,
        )
        stream = DispatchedStream(self, request, replace(route, priority=WARM_PRIORITY, osl=1))
        try:
            async for _ in stream:
                pass
        except _WARM_FAILURES as exc:
            log.info("speculative prefill skipped: %s", exc)
            return None
        return Warmed(stream.decision.worker, stream.cached_tokens or 0)

    def speculative_prefill(
        self, prompt_token_ids: Sequence[int], route: RouteRequest, retention: Retention | None = None
    ) -> asyncio.Task[Warmed | None] | None:
        """Start `warm` in the background (the frontend does not wait for it); None if too many
        are in flight already."""
        if len(self._warming) >= self.max_warming:
            return None
        task = asyncio.get_running_loop().create_task(self.warm(prompt_token_ids, route, retention))
        self._warming.add(task)
        task.add_done_callback(self._warming.discard)
        return task

    async def aclose(self) -> None:
        """Cancel speculative prefills still running."""
        tasks = list(self._warming)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
