"""Trace sinks: where records go. `JsonlSink` (a rotated, gzipped JSONL file) or `NullSink`.

The request path only enqueues: `emit` puts the record on a bounded queue and returns at once. A
background thread serialises and writes; when the queue is full the record is dropped and counted,
because a slow disk must never slow a token stream. Rotated files are compressed by a second thread
so a multi-megabyte gzip does not stall the writer either.

Files: the active file is `PATH` (e.g. `trace.jsonl`); at `rotate_bytes` it is renamed to
`trace.000001.jsonl` and compressed to `trace.000001.jsonl.gz`. Sequence numbers keep increasing
across restarts (the next one is found on disk), so names sort in write order and the newest `keep`
rotated files are kept.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import queue
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Record(Protocol):
    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class SinkStats:
    written: int = 0  # records written to a file
    dropped: int = 0  # records refused because the queue was full or the sink closed
    errors: int = 0  # records lost to a serialisation or I/O error
    rotations: int = 0
    queued: int = 0  # records waiting now


class TraceSink(Protocol):
    def emit(self, record: Record) -> bool:
        """Hand a record to the sink without blocking; False if it was dropped."""
        ...

    def stats(self) -> SinkStats: ...

    def close(self, timeout: float = 10.0) -> None: ...


class NullSink:
    """Tracing off: records are discarded (and not counted as drops)."""

    def emit(self, record: Record) -> bool:
        return True

    def stats(self) -> SinkStats:
        return SinkStats()

    def close(self, timeout: float = 10.0) -> None:
        return None


_STOP = object()


def rotated_name(path: Path, seq: int) -> Path:
    """`dir/trace.jsonl`, 7 → `dir/trace.000007.jsonl` (the name before compression)."""
    return path.with_name(f"{path.stem}.{seq:06d}{path.suffix}")


def rotated_files(path: Path) -> list[tuple[int, Path]]:
    """Rotated files of `path` on disk (compressed or not), oldest first."""
    pattern = re.compile(rf"{re.escape(path.stem)}\.(\d{{6,}}){re.escape(path.suffix)}(\.gz)?\Z")
    found: list[tuple[int, Path]] = []
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return found
    for entry in entries:
        m = pattern.match(entry.name)
        if m is not None and not entry.name.endswith(".tmp"):
            found.append((int(m.group(1)), entry))
    found.sort()
    return found


class JsonlSink:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rotate_bytes: int = 256 * 1024 * 1024,
        keep: int = 16,
        compress: bool = True,
        queue_size: int = 4096,
        flush_interval_s: float = 1.0,
    ) -> None:
        if rotate_bytes < 1 or keep < 1 or queue_size < 1:
            raise ValueError("rotate_bytes, keep and queue_size must be positive")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rotate_bytes = rotate_bytes
        self._keep = keep
        self._compress = compress
        self._flush_interval = flush_interval_s
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()  # guards the counters
        self._written = self._dropped = self._errors = self._rotations = 0
        self._closed = False
        existing = rotated_files(self.path)
        self._seq = existing[-1][0] if existing else 0
        self._file: Any = None
        self._size = 0
        self._compress_queue: queue.Queue[Path | None] = queue.Queue()
        self._compressor: threading.Thread | None = None
        if compress:
            self._compressor = threading.Thread(target=self._compress_loop, name="trace-gzip", daemon=True)
            self._compressor.start()
            for _, pending in existing:  # left uncompressed by a crash
                if pending.suffix != ".gz":
                    self._compress_queue.put(pending)
        self._writer = threading.Thread(target=self._write_loop, name="trace-writer", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ request path (any thread)

    def emit(self, record: Record) -> bool:
        if self._closed:
            self._count(dropped=1)
            return False
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self._count(dropped=1)
            return False
        return True

    def stats(self) -> SinkStats:
        with self._lock:
            return SinkStats(self._written, self._dropped, self._errors, self._rotations, self._queue.qsize())

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, stop the threads, finish compressing. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            log.warning("trace sink: writer did not drain in %.1fs; closing anyway", timeout)
        self._writer.join(timeout)
        if self._compressor is not None:
            self._compress_queue.put(None)
            self._compressor.join(timeout)

    def _count(self, *, written: int = 0, dropped: int = 0, errors: int = 0, rotations: int = 0) -> None:
        with self._lock:
            self._written += written
            self._dropped += dropped
            self._errors += errors
            self._rotations += rotations

    # ------------------------------------------------------------------ writer thread

    def _write_loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self._flush_interval)
            except queue.Empty:
                self._flush()
                continue
            if item is _STOP:
                break
            self._write(item)  # type: ignore[arg-type]
            if self._queue.empty():
                self._flush()  # a burst is written in one go; a lone record reaches disk at once
        # Records that raced with close (emitted after _STOP was queued) are written too.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._write(item)  # type: ignore[arg-type]
        self._close_file()

    def _write(self, record: Record) -> None:
        try:
            data = (json.dumps(record.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        except (TypeError, ValueError) as exc:
            log.warning("trace sink: cannot serialise %s: %s", type(record).__name__, exc)
            self._count(errors=1)
            return
        try:
            if self._file is None:
                self._open()
            if self._size > 0 and self._size + len(data) > self._rotate_bytes:
                self._rotate()
            self._file.write(data)
            self._size += len(data)
        except OSError as exc:
            log.warning("trace sink: cannot write %s: %s", self.path, exc)
            self._count(errors=1)
            self._close_file()
            return
        self._count(written=1)

    def _open(self) -> None:
        self._file = open(self.path, "ab")  # noqa: SIM115 (held open across records)
        self._size = self._file.tell()

    def _flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                log.warning("trace sink: cannot flush %s: %s", self.path, exc)
                self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                log.warning("trace sink: cannot close %s: %s", self.path, exc)
            self._file = None
            self._size = 0

    def _rotate(self) -> None:
        self._close_file()
        self._seq += 1
        target = rotated_name(self.path, self._seq)
        os.replace(self.path, target)
        self._count(rotations=1)
        if self._compressor is not None:
            self._compress_queue.put(target)
        else:
            self._prune()
        self._open()

    # ------------------------------------------------------------------ compressor thread

    def _compress_loop(self) -> None:
        while True:
            path = self._compress_queue.get()
            if path is None:
                return
            try:
                gz_tmp = path.with_name(path.name + ".gz.tmp")
                with open(path, "rb") as src, gzip.open(gz_tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1024 * 1024)
                os.replace(gz_tmp, path.with_name(path.name + ".gz"))
                path.unlink()
            except OSError as exc:
                log.warning("trace sink: cannot compress %s: %s", path, exc)
            self._prune()

    def _prune(self) -> None:
        """Delete the oldest rotated files beyond `keep`."""
        files = rotated_files(self.path)
        for _, old in files[: max(0, len(files) - self._keep)]:
            try:
                old.unlink()
            except OSError as exc:
                log.warning("trace sink: cannot delete %s: %s", old, exc)


def open_sink(
    path: str | None,
    *,
    rotate_bytes: int = 256 * 1024 * 1024,
    keep: int = 16,
    compress: bool = True,
    queue_size: int = 4096,
) -> TraceSink:
    """The sink a configuration asks for: none without a path, else a rotated JSONL file."""
    if not path:
        return NullSink()
    return JsonlSink(path, rotate_bytes=rotate_bytes, keep=keep, compress=compress, queue_size=queue_size)
