"""One worker's KV event stream applied to the router's index, exact across gaps and resyncs (pure).

A subscriber cannot trust a stream it joined late or lost messages of, so a worker's entries are
rebuilt from its snapshot (`KvSnapshot`: every stored hash and the sequence number `S` it
reflects) whenever that happens, and the events around the snapshot are reconciled by number:

- before the first snapshot (and while a resync is pending) batches are *held*, not applied;
- when the snapshot arrives it replaces the worker's entries, then the held batches are replayed:
  events numbered ≤ S are already in the snapshot and dropped, later ones are applied in order;
- events numbered ≤ the last applied one that arrive later still are *stale*: the worker computed
  them before the snapshot but published them after it (two sockets, no common order), so they
  are dropped too;
- a jump forward (events lost) asks for a new snapshot, and so does a heartbeat whose "next
  number" is past the last applied event + 1 (events lost at the end of a burst);
- `cleared` always resets the worker's entries, whatever its number: an engine sends it exactly
  once, first, when it starts, so a `cleared` numbered below the last applied event is a restart
  (or the very first event, late) and the events after it rebuild the worker's state in order.

The worker becomes routable (`RouterCore.add_worker`) with its first snapshot, never before: a
worker whose cache the router does not know would look empty and be preferred for no reason.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from agentserve.router.core import RouterCore
from agentserve.router.index import target
from agentserve.worker.engine import AllCleared, BlockRemoved, BlockStored, KvEvent, KvSnapshot


class BlockSizeMismatchError(ValueError):
    """The worker hashes blocks of another size than the router: its hashes can never match."""


@dataclass(slots=True)
class IngestCounters:
    """Totals over every worker (the router's metrics read them)."""

    messages: int = 0
    events: int = 0  # events applied to the index
    blocks: int = 0  # block hashes those events stored or removed
    stale: int = 0  # events dropped because a snapshot already covered them
    gaps: int = 0  # lost events detected (each leads to a resync)
    restarts: int = 0  # `cleared` events that reset a worker out of order
    dropped: int = 0  # held events discarded because the hold buffer was full
    resyncs: int = 0  # snapshots applied


class WorkerSync:
    """See the module docstring. Feed it `on_message` and, when `wants_snapshot`, `on_snapshot`."""

    __slots__ = (
        "_held",
        "_held_events",
        "core",
        "counters",
        "dp_rank",
        "key",
        "max_held_events",
        "member",
        "wants_snapshot",
        "worker",
    )

    def __init__(
        self,
        core: RouterCore,
        worker: str,
        counters: IngestCounters | None = None,
        *,
        max_held_events: int = 200_000,
        dp_rank: int | None = None,
    ) -> None:
        self.core = core
        self.worker = worker
        # One attention-DP rank's stream of the worker (None: a worker without ranks); each rank
        # has its own numbers, snapshot and index key.
        self.dp_rank = dp_rank
        self.key = target(worker, dp_rank)
        self.counters = counters if counters is not None else IngestCounters()
        self.max_held_events = max_held_events  # memory bound while a snapshot is awaited
        self.wants_snapshot = True
        self.member = False  # added to the core (routable) since the first snapshot
        self._held: deque[Sequence[KvEvent]] = deque()
        self._held_events = 0

    @property
    def live(self) -> bool:
        return self.member and not self.wants_snapshot

    # -- input -------------------------------------------------------------------------------------

    def on_message(self, first: int, events: Sequence[KvEvent]) -> None:
        """One decoded message: consecutive events from `first`, or a heartbeat (no events)."""
        self.counters.messages += 1
        if not events:
            self._heartbeat(first)
        elif self.wants_snapshot:
            self._hold(events)
        else:
            self._apply(events)

    def on_snapshot(self, snapshot: KvSnapshot) -> None:
        if snapshot.block_size != self.core.config.block_size:
            raise BlockSizeMismatchError(
                f"worker {self.worker} uses {snapshot.block_size}-token blocks, the router "
                f"{self.core.config.block_size}: set the same block_size on both"
            )
        if not self.member:
            self.core.add_worker(self.worker, self.dp_rank)
            self.member = True
        self.core.resync(self.worker, snapshot, self.dp_rank)
        self.counters.resyncs += 1
        self.wants_snapshot = False
        held, self._held, self._held_events = self._held, deque(), 0
        for batch in held:
            if self.wants_snapshot:  # a gap among the held batches: keep holding for the next one
                self._hold(batch)
            else:
                self._apply(batch)

    def request_resync(self) -> None:
        """Distrust the current entries (e.g. an undecodable message): hold until a new snapshot."""
        self.wants_snapshot = True

    # -- internals ---------------------------------------------------------------------------------

    def _heartbeat(self, next_seq: int) -> None:
        if self.wants_snapshot:
            return
        last = self.core.index.last_seq(self.key)
        if last is not None and next_seq > last + 1:
            self.counters.gaps += 1
            self.wants_snapshot = True

    def _hold(self, events: Sequence[KvEvent]) -> None:
        self._held.append(events)
        self._held_events += len(events)
        # Drop the oldest batches past the bound: if the snapshot does not cover them, the replay
        # sees the hole and asks for another snapshot.
        while self._held_events > self.max_held_events and len(self._held) > 1:
            old = self._held.popleft()
            self._held_events -= len(old)
            self.counters.dropped += len(old)

    def _apply(self, events: Sequence[KvEvent]) -> None:
        # A message's events are consecutive (the wire numbers them first, first + 1, ...).
        index = self.core.index
        last = index.last_seq(self.key)
        if last is None:  # cannot happen once resynced; treat as lost state
            self._gap(events)
            return
        first = events[0].seq
        if first > last + 1:
            self._gap(events)
            return
        if first <= last:
            skip = min(last + 1 - first, len(events))
            restart = next((i for i in range(skip - 1, -1, -1) if isinstance(events[i], AllCleared)), None)
            if restart is not None:
                index.resync(self.key, (), events[restart].seq)
                self.counters.restarts += 1
                events = events[restart + 1 :]
            else:
                self.counters.stale += skip
                events = events[skip:]
            if not events:
                return
        if not self.core.apply_events(self.worker, events, self.dp_rank):  # only if a message broke numbering
            self._gap(events)
            return
        counters = self.counters
        counters.events += len(events)
        for event in events:
            if isinstance(event, BlockStored | BlockRemoved):
                counters.blocks += len(event.block_hashes)

    def _gap(self, events: Sequence[KvEvent]) -> None:
        self.counters.gaps += 1
        self.wants_snapshot = True
        self._hold(events)
