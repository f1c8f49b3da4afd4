"""`agentserve trace`: per-session summary numbers and a valid Perfetto trace-event timeline."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from telemetry_synth import known_trace, synthetic_trace, write_jsonl

from agentserve.cli import main
from agentserve.telemetry.report import (
    Loaded,
    _lanes,
    parse_lines,
    percentile,
    perfetto,
    summarize,
    union_length,
)


def write_split(tmp_path: Path, lines: list[dict[str, Any]]) -> list[Path]:
    """Requests in a plain file (with a torn last line), tool events in a gzip file named .jsonl."""
    plain = tmp_path / "trace.jsonl"
    requests = [x for x in lines if x["event_type"] == "request_end"]
    tools = [x for x in lines if x["event_type"] != "request_end"]
    plain.write_text("".join(json.dumps(x) + "\n" for x in requests) + '{"event_type": "request_e')
    gz = tmp_path / "trace.000001.jsonl"  # gzip recognised by content, not by name
    gz.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in tools).encode()))
    return [plain, gz]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["trace", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_summary_numbers_on_a_hand_timed_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_split(tmp_path, known_trace())
    code, out, err = run_cli(capsys, *map(str, files), "--json")
    assert code == 0
    assert "skipped 1 unreadable line" in err
    report = json.loads(out)
    assert (report["requests"], report["tool_events"], report["skipped_lines"]) == (5, 7, 1)
    sessions = {s["session_id"]: s for s in report["sessions"]}
    assert list(sessions) == ["sess-a", "sess-b", "-", "sess-c"]  # by first activity; tool-only last

    a = sessions["sess-a"]
    assert (a["turns"], a["errors"], a["tool_calls"], a["tool_executions"], a["drift_events"]) == (
        3,
        0,
        3,
        3,
        1,
    )
    assert a["ttft_p50_ms"] == pytest.approx(100.0)
    assert a["ttft_p95_ms"] == pytest.approx(199.0)  # 100 + 0.9 * (210 - 100)
    assert (a["input_tokens"], a["cached_tokens"], a["output_tokens"]) == (3500, 2200, 80)
    assert a["cache_hit_ratio"] == pytest.approx(2200 / 3500, abs=1e-4)
    assert a["model_time_ms"] == pytest.approx(1100.0)  # 500 + 300 + 300
    assert a["tool_time_ms"] == pytest.approx(1550.0)  # 1000 + the union of two parallel calls (550)
    assert a["dispatch_lead_p50_ms"] == pytest.approx(100.0)  # leads 100, 100, 50
    assert a["dispatch_lead_mean_ms"] == pytest.approx(250.0 / 3, abs=1e-3)

    b = sessions["sess-b"]
    assert (b["turns"], b["ttft_p50_ms"], b["cache_hit_ratio"], b["tool_time_ms"]) == (1, 300.0, 0.5, 0.0)
    assert b["dispatch_lead_p50_ms"] is None
    none = sessions["-"]
    assert (none["turns"], none["errors"], none["ttft_p50_ms"], none["cache_hit_ratio"]) == (1, 1, None, None)
    c = sessions["sess-c"]
    assert (c["turns"], c["tool_executions"], c["tool_time_ms"]) == (0, 1, 200.0)

    total = report["total"]
    assert total["turns"] == 5 and total["errors"] == 1
    assert total["model_time_ms"] == pytest.approx(1501.0)  # sess-a's first turn overlaps sess-b's
    assert total["tool_time_ms"] == pytest.approx(1750.0)
    assert total["cache_hit_ratio"] == pytest.approx(2450 / 4000)


def test_table_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_split(tmp_path, known_trace())
    code, out, _ = run_cli(capsys, *map(str, files))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "session", "turns", "ttft", "p50", "ttft", "p95", "cache", "hit", "model", "time",
        "tool", "time", "tool/model", "calls", "lead", "p50", "drift",
    ]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["sess-a"][1:] == [
        "3",
        "100ms",
        "199ms",
        "62.9%",
        "1100ms",
        "1550ms",
        "1.41",
        "3",
        "100ms",
        "1",
    ]
    assert rows["(all)"][1] == "5"
    assert len(lines) == 2 + 4 + 1


def test_ids_from_files_cannot_put_control_characters_on_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = known_trace()[:1]
    lines[0]["agent_context"]["session_id"] = "evil\x1b[2J" + "x" * 100
    path = tmp_path / "t.jsonl"
    write_jsonl(str(path), lines)
    _, out, _ = run_cli(capsys, str(path))
    assert "\x1b" not in out and "evil??2J" in out and "…" in out


def test_missing_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, str(tmp_path / "nope.jsonl"))
    assert code == 2 and "nope.jsonl" in err


def test_percentile_and_union_length() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert union_length([]) == 0.0
    assert union_length([(0, 1), (2, 3)]) == 2.0
    assert union_length([(0, 5), (1, 2), (4, 7), (10, 11)]) == 8.0


def test_lanes_never_overlap() -> None:
    intervals = [(0.0, 5.0), (1.0, 2.0), (2.0, 3.0), (4.0, 6.0), (5.0, 7.0)]
    lanes = _lanes(intervals)
    assert lanes == [0, 1, 1, 1, 0]
    by_lane: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for interval, lane in zip(intervals, lanes, strict=True):
        by_lane[lane].append(interval)
    for spans in by_lane.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


# ----------------------------------------------------------------------------- Perfetto


def validate_trace_events(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The trace-event format as Perfetto reads it: required keys and types per phase, thread
    metadata for every track, non-decreasing timestamps per track, and slices that nest."""
    assert set(doc) >= {"traceEvents"}
    assert doc.get("displayTimeUnit") in ("ms", "ns")
    named_threads: set[tuple[int, int]] = set()
    named_processes: set[int] = set()
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    flows: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        assert isinstance(e["name"], str) and e["name"]
        assert e["ph"] in ("X", "i", "M", "s", "f"), e
        assert type(e["pid"]) is int and type(e["tid"]) is int
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            assert isinstance(e["args"], dict)
            if e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], int | float) and e["dur"] >= 0
        elif e["ph"] == "i":
            assert e["s"] in ("t", "p", "g")
        else:
            flows[e["id"]].append(e)
        tracks[(e["pid"], e["tid"])].append(e)
    for pair in flows.values():  # one start and one finish per id, the finish not before the start
        start, finish = sorted(pair, key=lambda e: e["ph"] != "s")
        assert (start["ph"], finish["ph"], finish.get("bp")) == ("s", "f", "e")
        assert finish["ts"] >= start["ts"]
    for key, events in tracks.items():
        assert key in named_threads and key[0] in named_processes
        timestamps = [e["ts"] for e in events]
        assert timestamps == sorted(timestamps), key
        stack: list[float] = []  # end times of open slices
        for e in events:
            while stack and e["ts"] >= stack[-1] - 1e-6:
                stack.pop()
            end = e["ts"] + e.get("dur", 0.0)
            assert not stack or end <= stack[-1] + 1e-6, f"slice {e['name']} crosses its parent's end"
            if e["ph"] == "X":
                stack.append(end)
    return tracks


def test_perfetto_timeline_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = write_split(tmp_path, known_trace())
    out_path = tmp_path / "timeline.json"
    code, _, _ = run_cli(capsys, *map(str, files), "--perfetto", str(out_path))
    assert code == 0
    doc = json.loads(out_path.read_text())
    tracks = validate_trace_events(doc)
    events = [e for evs in tracks.values() for e in evs]
    processes = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert processes == {"session sess-a", "session sess-b", "session -", "session sess-c"}
    turns = [e for e in events if e.get("cat") == "request"]
    assert len(turns) == 5
    stages = [e["name"] for e in events if e.get("cat") == "stage"]
    assert {"preprocess", "queue", "prefill", "decode"} <= set(stages)
    dispatches = [e for e in events if e["ph"] == "i"]
    assert sorted(e["name"] for e in dispatches) == ["dispatch Bash", "dispatch Grep", "dispatch Read"]
    tools = [e for e in events if e.get("cat") == "tool"]
    assert sorted(e["name"] for e in tools) == ["Bash", "Grep", "Read", "Write"]
    grep = next(e for e in tools if e["name"] == "Grep")
    assert grep["args"]["status"] == "error" and grep["args"]["error_type"] == "exit_1"
    assert grep["args"]["request_id"] == "req-2"
    assert grep["dur"] == pytest.approx(500_000.0)  # microseconds
    # The two parallel calls of sess-a's second turn overlap, so they sit on two tool lanes.
    read = next(e for e in tools if e["name"] == "Read")
    assert read["tid"] != grep["tid"] and read["pid"] == grep["pid"]
    # Times are microseconds from the first event: sess-a's first turn starts at 0.
    first = min(turns, key=lambda e: e["ts"])
    assert first["ts"] == 0 and first["dur"] == pytest.approx(500_000.0)
    bash = next(e for e in dispatches if e["name"] == "dispatch Bash")
    assert bash["ts"] == pytest.approx(400_000.0) and bash["args"]["lead_ms"] == pytest.approx(100.0)
    # Each joined execution has an arrow from its dispatch (on the turn's lane) to its slice.
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert len(flows) == 6
    bash_flow = [e for e in flows if e["ts"] in (bash["ts"], 420_000.0)]
    assert sorted(e["ph"] for e in bash_flow) == ["f", "s"]


def test_concurrent_turns_of_one_session_get_their_own_model_lanes() -> None:
    lines = known_trace()
    # Make sess-b's turn part of sess-a: it overlaps sess-a's first turn.
    lines[1]["agent_context"]["session_id"] = "sess-a"
    loaded = parse_lines(json.dumps(x) for x in lines)
    tracks = validate_trace_events(perfetto(loaded))
    names: dict[int, set[int]] = defaultdict(set)
    for pid, tid in tracks:
        names[pid].add(tid)
    assert any({1, 2} <= tids for tids in names.values())


def test_synthetic_session_mix_is_a_valid_timeline() -> None:
    loaded = parse_lines(json.dumps(x) for x in synthetic_trace())
    assert loaded.skipped == 0 and len(loaded.requests) == 12
    tracks = validate_trace_events(perfetto(loaded))
    assert len({pid for pid, _ in tracks}) == 3
    names = {e["args"]["name"] for e in perfetto(loaded)["traceEvents"] if e["name"] == "process_name"}
    assert "session sub-agent-1 (parent main-7f3a)" in names
    summaries = {s.session_id: s for s in summarize(loaded)}
    assert summaries["main-7f3a"].turns == 5 and summaries["main-7f3a"].tool_executions > 0


def test_empty_input_gives_an_empty_but_valid_timeline() -> None:
    doc = perfetto(Loaded())
    validate_trace_events(doc)
    assert doc["traceEvents"] == []


def test_the_example_timeline_in_docs_is_what_the_cli_writes_today() -> None:
    # Regenerate with the commands in telemetry_synth.py's docstring if the format changes on purpose.
    path = Path(__file__).parents[3] / "docs" / "telemetry-example.perfetto.json"
    loaded = parse_lines(json.dumps(x) for x in synthetic_trace())
    assert json.loads(path.read_text()) == perfetto(loaded)
    assert path.stat().st_size < 50_000
