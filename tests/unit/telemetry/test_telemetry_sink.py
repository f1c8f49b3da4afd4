"""JsonlSink: rotation, gzip, bounded retention, never blocking the caller, counting drops."""

from __future__ import annotations

import gzip
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentserve.telemetry.sink import JsonlSink, NullSink, open_sink, rotated_files, rotated_name


class Rec:
    def __init__(self, n: int, pad: int = 40) -> None:
        self.n = n
        self.pad = pad

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "pad": "x" * self.pad}


class Blocking:
    """A record whose serialisation waits: holds the writer thread as long as the test wants."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def to_json(self) -> dict[str, Any]:
        self.entered.set()
        assert self.release.wait(10)
        return {"n": -1}


class Unserialisable:
    def to_json(self) -> dict[str, Any]:
        return {"value": object()}


def read_lines(path: Path) -> list[dict[str, Any]]:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_rotation_gzip_and_bounded_retention(tmp_path: Path) -> None:
    path = tmp_path / "traces" / "trace.jsonl"  # the directory is created
    sink = JsonlSink(path, rotate_bytes=300, keep=3, queue_size=1000)
    for n in range(60):
        assert sink.emit(Rec(n))
    sink.close()
    stats = sink.stats()
    assert (stats.written, stats.dropped, stats.errors, stats.queued) == (60, 0, 0, 0)
    assert stats.rotations >= 10

    rotated = rotated_files(path)
    assert [seq for seq, _ in rotated] == list(range(stats.rotations - 2, stats.rotations + 1))  # newest 3
    assert all(p.name.endswith(".jsonl.gz") for _, p in rotated)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, *(p.name for _, p in rotated)])
    for _, p in rotated:
        raw = gzip.decompress(p.read_bytes())
        assert 0 < len(raw) <= 300  # each rotated file stayed under the limit
    # The kept files and the active one hold the newest records, contiguous and in order.
    kept = [n for _, p in rotated for n in (line["n"] for line in read_lines(p))]
    kept += [line["n"] for line in read_lines(path)]
    assert kept == list(range(60 - len(kept), 60))


def test_without_gzip_rotated_files_stay_plain_and_are_still_pruned(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    sink = JsonlSink(path, rotate_bytes=200, keep=2, compress=False)
    for n in range(30):
        sink.emit(Rec(n))
    sink.close()
    rotated = rotated_files(path)
    assert len(rotated) == 2 and all(p.suffix == ".jsonl" for _, p in rotated)


def test_sequence_numbers_continue_across_restarts_and_leftovers_are_compressed(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    leftover = rotated_name(path, 41)  # a crash between rotation and compression
    leftover.write_text('{"n": 0}\n')
    sink = JsonlSink(path, rotate_bytes=100, keep=10)
    for n in range(5):
        sink.emit(Rec(n))
    sink.close()
    seqs = [seq for seq, _ in rotated_files(path)]
    assert seqs[0] == 41 and seqs[1:] == list(range(42, 42 + len(seqs) - 1))
    assert all(p.name.endswith(".gz") for _, p in rotated_files(path))


def test_a_record_larger_than_the_limit_gets_a_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sink = JsonlSink(path, rotate_bytes=100, keep=5)
    sink.emit(Rec(0, pad=500))
    sink.emit(Rec(1, pad=500))
    sink.close()
    assert [r["n"] for r in read_lines(path)] == [1]
    assert [r["n"] for _, p in rotated_files(path) for r in read_lines(p)] == [0]


def test_emit_never_blocks_and_counts_drops_when_the_queue_is_full(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "t.jsonl", queue_size=2)
    blocker = Blocking()
    assert sink.emit(blocker)
    assert blocker.entered.wait(5)  # the writer holds it: the queue is empty again
    assert sink.emit(Rec(1)) and sink.emit(Rec(2))  # fills the queue
    began = time.perf_counter()
    results = [sink.emit(Rec(n)) for n in range(3, 103)]
    elapsed = time.perf_counter() - began
    assert not any(results)
    assert elapsed < 0.5  # 100 refused emits, no waiting on the stuck writer
    assert sink.stats().dropped == 100 and sink.stats().queued == 2
    blocker.release.set()
    sink.close()
    assert sink.stats().written == 3
    assert [r["n"] for r in read_lines(tmp_path / "t.jsonl")] == [-1, 1, 2]


def test_emit_after_close_is_a_counted_drop_and_close_is_idempotent(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "t.jsonl")
    sink.close()
    sink.close()
    assert not sink.emit(Rec(0))
    assert sink.stats().dropped == 1


def test_a_record_that_cannot_be_serialised_is_an_error_not_a_dead_writer(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "t.jsonl")
    sink.emit(Unserialisable())
    sink.emit(Rec(7))
    sink.close()
    assert (sink.stats().errors, sink.stats().written) == (1, 1)
    assert [r["n"] for r in read_lines(tmp_path / "t.jsonl")] == [7]


def test_records_are_flushed_without_waiting_for_close(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sink = JsonlSink(path, flush_interval_s=0.05)
    sink.emit(Rec(1))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (path.exists() and path.read_text()):
        time.sleep(0.01)
    assert [r["n"] for r in read_lines(path)] == [1]
    sink.close()


def test_open_sink_and_null_sink(tmp_path: Path) -> None:
    null = open_sink(None)
    assert isinstance(null, NullSink) and null.emit(Rec(1)) and null.stats().written == 0
    null.close()
    sink = open_sink(str(tmp_path / "t.jsonl"), rotate_bytes=1000, keep=1, compress=False, queue_size=4)
    assert isinstance(sink, JsonlSink)
    sink.close()
    with pytest.raises(ValueError):
        JsonlSink(tmp_path / "u.jsonl", keep=0)
