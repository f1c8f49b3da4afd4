"""Publishes an engine's KV events on a ZeroMQ PUB socket (wire format: `kvwire`).

PUB never blocks the engine: a subscriber that falls more than `hwm` messages behind loses
messages, sees a sequence-number gap and resyncs from the snapshot endpoint. Batches are sent as
the engine produced them (one message per iteration), split above `max_batch` events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import zmq

from agentserve.worker.engine import KvEvent
from agentserve.worker.kvwire import DEFAULT_TOPIC, encode_batch


class KvEventPublisher:
    def __init__(
        self,
        endpoint: str,
        *,
        topic: bytes = DEFAULT_TOPIC,
        hwm: int = 100_000,
        max_batch: int = 4096,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.topic = topic
        self.max_batch = max_batch
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        last = self._sock.getsockopt(zmq.LAST_ENDPOINT)
        self.endpoint = last.decode() if isinstance(last, bytes) else str(last)
        self.events_published = 0
        self.messages_published = 0
        self.last_seq = 0

    def publish(self, events: Sequence[KvEvent]) -> None:
        sock, topic, step = self._sock, self.topic, self.max_batch
        for i in range(0, len(events), step):
            chunk = events[i : i + step]
            sock.send_multipart(encode_batch(chunk, topic), flags=zmq.NOBLOCK)
            self.messages_published += 1
        if events:
            self.events_published += len(events)
            self.last_seq = events[-1].seq

    async def run(self, batches: AsyncIterator[list[KvEvent]]) -> None:
        """Publish every batch of a subscription until it ends."""
        async for batch in batches:
            self.publish(batch)

    def close(self) -> None:
        self._sock.close(linger=0)
