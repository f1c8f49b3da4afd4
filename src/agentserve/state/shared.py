"""The frontend's view of the shared store: a read-through, write-through layer over the call
memory and the response store that the API codecs read synchronously.

Before a request is decoded, `prefetch` pulls what its decode may look up and this process does not
hold (the turns behind the history's call ids; the `previous_response_id` chain's head) into the
local caches, in one MGET or GET. After a turn, `save_*` write it through once per request, before
the stream's last frame, so a client's next turn may go to any replica. Nothing here runs per token.

A store that does not answer degrades: lookups count as misses (the request is served without the
restore), writes are dropped, and both are counted and logged once per outage. Only
`previous_response_id` cannot be served without the store: it gets the API's 503.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agentserve.api.errors import OverloadedError
from agentserve.api.memory import CallMemory
from agentserve.api.responses import ResponseStore
from agentserve.conversation import Message, Text
from agentserve.state import codec
from agentserve.state.store import InProcessStore, StateStore, StoreUnavailable

log = logging.getLogger("agentserve.state")

TURN = "turn"
RESPONSE = "resp"


def _norm_call_id(call_id: str) -> str:
    # The call memory's own key normalisation (rewritten ids still match): letters and digits only.
    return "".join(c for c in call_id if c.isascii() and c.isalnum())


def history_call_ids(api: str, body: Any) -> list[str]:
    """The assistant tool-call ids in a Chat or Anthropic request body (pure; malformed parts are
    skipped, the codec reports them)."""
    out: list[str] = []
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return out
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        if api == "chat":
            calls = m.get("tool_calls")
            if isinstance(calls, list):
                out += [c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str)]
        elif api == "anthropic":
            content = m.get("content")
            if isinstance(content, list):
                out += [
                    c["id"]
                    for c in content
                    if isinstance(c, dict) and c.get("type") == "tool_use" and isinstance(c.get("id"), str)
                ]
    return out


class StoreUnavailableError(OverloadedError):
    """`previous_response_id` while the shared store does not answer (503 in the API's shape)."""


class StateMetrics:
    def __init__(self, registry: CollectorRegistry | None, backend: str) -> None:
        r = registry if registry is not None else CollectorRegistry()
        p = "agentserve_state"
        self.lookups = Counter(
            f"{p}_lookups", "Shared-store lookups by kind and result.", ["kind", "result"], registry=r
        )
        self.writes = Counter(
            f"{p}_writes", "Entries written to the shared store.", ["kind", "result"], registry=r
        )
        self.written_bytes = Counter(
            f"{p}_written_bytes", "Bytes written to the shared store.", ["kind"], registry=r
        )
        self.entries = Gauge(f"{p}_entries", "Entries held (in-process store only).", registry=r)
        self.size = Gauge(f"{p}_size_bytes", "Bytes held (in-process store only).", registry=r)
        self.latency = Histogram(
            f"{p}_op_seconds",
            "Shared-store round trip per operation.",
            ["op"],
            registry=r,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0),
        )
        self.up = Gauge(f"{p}_up", "1 while the shared store answers.", ["backend"], registry=r)
        # Not state, but the same "cluster-grade serving" family (router.dispatch migrations).
        self.migrations = Counter(
            "agentserve_stream_migrations",
            "Streams moved to another worker after theirs died mid-stream.",
            registry=r,
        )
        self.up.labels(backend).set(1)
        self._backend = backend

    def set_up(self, up: bool) -> None:
        self.up.labels(self._backend).set(1 if up else 0)


class SharedState:
    def __init__(
        self,
        store: StateStore,
        memory: CallMemory,
        responses: ResponseStore,
        *,
        response_ttl_s: float,
        turn_ttl_s: float,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.memory = memory
        self.responses = responses
        self.response_ttl_s = response_ttl_s
        self.turn_ttl_s = turn_ttl_s
        self.metrics = StateMetrics(registry, store.name)
        self._down_since: float | None = None
        self._local = isinstance(store, InProcessStore)  # the local caches see every write
        if isinstance(store, InProcessStore):
            local = store
            self.metrics.entries.set_function(lambda: len(local))
            self.metrics.size.set_function(lambda: local.size_bytes)

    # -- outage bookkeeping: log the transition once, not every request --------------------------

    def _failed(self, op: str, exc: StoreUnavailable) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.metrics.set_up(False)
            log.warning("state store unavailable (%s: %s); serving without shared state", op, exc)

    def _answered(self) -> None:
        if self._down_since is not None:
            log.warning("state store back after %.1f s", time.monotonic() - self._down_since)
            self._down_since = None
            self.metrics.set_up(True)

    # -- before decode ---------------------------------------------------------------------------

    async def prefetch(self, api: str, body: Any, scope: str) -> None:
        """Pull what this request's decode may look up into the local caches (the chain head of a
        Responses `previous_response_id`). Raises only StoreUnavailableError, for a
        `previous_response_id` the store could not be asked about."""
        if api == "responses" and isinstance(body, dict):
            previous = body.get("previous_response_id")
            if isinstance(previous, str) and previous:
                await self._load_response(scope, previous)

    async def prefetch_turns(self, api: str, body: Any, scope: str) -> None:
        """Pull the turns behind a Chat or Anthropic history's call ids into the call memory, under
        the conversation's memory scope (`memory.call_scope`): after identification, before restore."""
        if api == "responses":
            return
        ids = history_call_ids(api, body)
        if not ids:
            return
        missing = list(
            dict.fromkeys(k for i in ids if (k := _norm_call_id(i)) and self.memory.turn(i, scope) is None)
        )
        if missing:
            await self._load_turns(scope, missing)

    async def _load_turns(self, scope: str, keys: list[str]) -> None:
        t = time.perf_counter()
        try:
            values = await self.store.get_many(TURN, scope, keys)
        except StoreUnavailable as exc:
            self._failed("get turns", exc)
            self.metrics.lookups.labels(TURN, "unavailable").inc(len(keys))
            return
        self._answered()
        self.metrics.latency.labels("get_many").observe(time.perf_counter() - t)
        found = 0
        for value in values:
            if value is None:
                continue
            try:
                self.memory.remember(codec.decode_turn(value), scope)
                found += 1
            except ValueError as exc:
                log.warning("state store: dropping an unreadable turn entry: %s", exc)
        self.metrics.lookups.labels(TURN, "hit").inc(found)
        self.metrics.lookups.labels(TURN, "miss").inc(len(keys) - found)

    async def _load_response(self, scope: str, response_id: str) -> None:
        """Refresh the local copy from the store: another replica may have deleted it. A store that
        does not answer leaves the local copy in use; with none, the API's 503."""
        held = (scope, response_id) in self.responses
        if held and self._local:
            return
        try:
            entry = await self._get_response(scope, response_id)
        except StoreUnavailableError:
            if held:
                return
            raise
        if entry is None:
            self.responses.drop(response_id, scope)
        else:
            system, history, _ = entry
            self.responses.put(response_id, history, system, scope)

    async def _get_response(
        self, scope: str, response_id: str
    ) -> tuple[tuple[Text, ...], tuple[Message, ...], dict[str, Any] | None] | None:
        t = time.perf_counter()
        try:
            value = await self.store.get(RESPONSE, scope, response_id)
        except StoreUnavailable as exc:
            self._failed("get response", exc)
            self.metrics.lookups.labels(RESPONSE, "unavailable").inc()
            raise StoreUnavailableError("the response store is unavailable; retry shortly") from None
        self._answered()
        self.metrics.latency.labels("get").observe(time.perf_counter() - t)
        if value is None:
            self.metrics.lookups.labels(RESPONSE, "miss").inc()
            return None
        try:
            entry = codec.decode_response(value)
        except ValueError as exc:
            log.warning("state store: unreadable response %s: %s", response_id, exc)
            self.metrics.lookups.labels(RESPONSE, "miss").inc()
            return None
        self.metrics.lookups.labels(RESPONSE, "hit").inc()
        return entry

    # -- after a turn ----------------------------------------------------------------------------

    async def save_turns(self, scope: str, turns: Iterable[Message]) -> None:
        """Write remembered assistant turns through, one entry per call id (pipelined)."""
        items: list[tuple[str, bytes]] = []
        for message in turns:
            data = codec.encode_turn(message)
            items += [(k, data) for call in message.tool_calls if (k := _norm_call_id(call.id))]
        if items:
            await self._put(TURN, scope, items, self.turn_ttl_s)

    async def save_response(
        self,
        scope: str,
        response_id: str,
        system: tuple[Text, ...],
        history: tuple[Message, ...],
        body: dict[str, Any] | None,
    ) -> None:
        data = codec.encode_response(system, history, body)
        await self._put(RESPONSE, scope, [(response_id, data)], self.response_ttl_s)

    async def _put(self, kind: str, scope: str, items: list[tuple[str, bytes]], ttl_s: float) -> None:
        t = time.perf_counter()
        try:
            await self.store.put_many(kind, scope, items, ttl_s)
        except StoreUnavailable as exc:
            self._failed(f"put {kind}", exc)
            self.metrics.writes.labels(kind, "unavailable").inc(len(items))
            return
        self._answered()
        self.metrics.latency.labels("put").observe(time.perf_counter() - t)
        self.metrics.writes.labels(kind, "ok").inc(len(items))
        self.metrics.written_bytes.labels(kind).inc(sum(len(v) for _, v in items))

    # -- GET / DELETE /v1/responses/{id} ---------------------------------------------------------

    async def response_body(self, scope: str, response_id: str) -> dict[str, Any] | None:
        """The stored response object (None: unknown to this API key, or expired)."""
        entry = await self._get_response(scope, response_id)
        return None if entry is None else entry[2]

    async def delete_response(self, scope: str, response_id: str) -> bool:
        local = self.responses.drop(response_id, scope)
        try:
            remote = await self.store.delete(RESPONSE, scope, response_id)
        except StoreUnavailable as exc:
            self._failed("delete response", exc)
            raise StoreUnavailableError("the response store is unavailable; retry shortly") from None
        self._answered()
        return local or remote

    async def close(self) -> None:
        await self.store.close()
