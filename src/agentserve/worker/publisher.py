"""Publishes an engine's KV events on a ZeroMQ PUB socket (wire format: `kvwire`).

PUB never blocks the engine: a subscriber that falls more than `hwm` messages behind loses
messages, sees a sequence-number gap and resyncs from the snapshot endpoint. Batches are sent as
the engine produced them (one message per iteration), split above `max_batch` events. While no
batch goes out for `heartbeat_s`, a heartbeat does (`kvwire.encode_heartbeat`): subscribers use
it to tell an idle worker from one that stopped publishing.

Events of an engine with attention-DP ranks (`dp_rank` set) go out per rank, each rank's on its
own topic with its own numbers (`kvwire.rank_topic`), and every rank seen gets heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import zmq

from agentserve.worker.engine import KvEvent
from agentserve.worker.kvwire import (
    DEFAULT_TOPIC,
    HEARTBEAT_INTERVAL_S,
    encode_batch,
    encode_heartbeat,
    rank_topic,
    split_by_rank,
)


class KvEventPublisher:
    def __init__(
        self,
        endpoint: str,
        *,
        topic: bytes = DEFAULT_TOPIC,
        hwm: int = 100_000,
        max_batch: int = 4096,
        coalesce_s: float = 0.005,
        heartbeat_s: float | None = HEARTBEAT_INTERVAL_S,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.topic = topic
        self.max_batch = max_batch
        # After a send, wait this long before the next: the engine's per-step batches queued
        # meanwhile go out as one message (a pyzmq send per engine step was ~13 % of the worker in
        # the per-token regime); the router's view of the cache lags by at most this.
        self.coalesce_s = coalesce_s
        self.heartbeat_s = heartbeat_s  # None: no heartbeats
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        last = self._sock.getsockopt(zmq.LAST_ENDPOINT)
        self.endpoint = last.decode() if isinstance(last, bytes) else str(last)
        self.events_published = 0
        self.messages_published = 0
        self.last_seqs: dict[int | None, int] = {}  # per attention-DP rank (None: no ranks)
        self.heartbeats_sent = 0
        self._last_send = time.monotonic()

    def publish(self, events: Sequence[KvEvent]) -> None:
        if not events:
            return
        sock, step = self._sock, self.max_batch
        for rank, stream in split_by_rank(events).items():
            topic = rank_topic(self.topic, rank)
            for i in range(0, len(stream), step):
                sock.send_multipart(encode_batch(stream[i : i + step], topic), flags=zmq.NOBLOCK)
                self.messages_published += 1
            self.last_seqs[rank] = stream[-1].seq
        self.events_published += len(events)
        self._last_send = time.monotonic()

    @property
    def last_seq(self) -> int:
        """The last sequence number published on the stream without ranks."""
        return self.last_seqs.get(None, 0)

    @last_seq.setter
    def last_seq(self, seq: int) -> None:
        self.last_seqs[None] = seq

    def heartbeat(self) -> None:
        for rank in self.last_seqs or {None: 0}:
            topic = rank_topic(self.topic, rank)
            next_seq = self.last_seqs.get(rank, 0) + 1
            self._sock.send_multipart(encode_heartbeat(next_seq, topic), flags=zmq.NOBLOCK)
        self.heartbeats_sent += 1
        self._last_send = time.monotonic()

    async def run(self, batches: AsyncIterator[list[KvEvent]]) -> None:
        """Publish every batch of a subscription until it ends, with heartbeats while idle."""
        beats = asyncio.create_task(self._beat()) if self.heartbeat_s else None
        try:
            async for batch in batches:
                self.publish(batch)
                if self.coalesce_s > 0:
                    await asyncio.sleep(self.coalesce_s)
        finally:
            if beats is not None:
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats

    async def _beat(self) -> None:
        interval = self.heartbeat_s
        assert interval is not None
        while True:
            idle = time.monotonic() - self._last_send
            if idle >= interval:
                self.heartbeat()
                idle = 0.0
            await asyncio.sleep(interval - idle)

    def close(self) -> None:
        self._sock.close(linger=0)
