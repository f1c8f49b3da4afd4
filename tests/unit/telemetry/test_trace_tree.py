"""`agentserve trace` shows subagent trees: each session under its parent (table, JSON, Perfetto)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from telemetry_synth import Call, Turn, build, write_jsonl

from agentserve.cli import main
from agentserve.conversation import Usage
from agentserve.telemetry.report import parse_lines, perfetto, summarize, tree_order


def turn(session: str, start: float, parent: str | None = None) -> Turn:
    return Turn(session, start, start + 0.1, start + 0.5, Usage(1000, 50, 800), parent=parent)


def tree_trace() -> list[Turn]:
    """A root that spawns two explorers (one of which spawns its own child), and an unrelated session;
    activity interleaved as it would be."""
    return [
        turn("root", 0.0),
        turn("other", 0.2),
        turn("explore-a", 1.0, parent="root"),
        turn("explore-b", 1.1, parent="root"),
        turn("grandchild", 1.5, parent="explore-a"),
        turn("explore-a", 2.0, parent="root"),
        turn("root", 3.0),
    ]


def test_tree_order_puts_children_under_their_parents() -> None:
    names = ["root", "other", "explore-a", "explore-b", "grandchild"]
    parents = {"explore-a": "root", "explore-b": "root", "grandchild": "explore-a"}
    assert tree_order(names, parents) == [
        ("root", 0),
        ("explore-a", 1),
        ("grandchild", 2),
        ("explore-b", 1),
        ("other", 0),
    ]


def test_tree_order_survives_untrusted_links() -> None:
    # A parent with no records of its own, and a cycle: every session appears exactly once.
    order = tree_order(["a", "b", "c"], {"a": "b", "b": "a", "c": "gone"})
    assert sorted(name for name, _ in order) == ["a", "b", "c"]
    assert ("c", 1) in order


def test_summaries_and_table_show_the_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = build(tree_trace())
    summaries = summarize(parse_lines(json.dumps(x) for x in lines))
    assert [(s.session_id, s.depth, s.parent_session_id) for s in summaries] == [
        ("root", 0, None),
        ("explore-a", 1, "root"),
        ("grandchild", 2, "explore-a"),
        ("explore-b", 1, "root"),
        ("other", 0, None),
    ]
    path = tmp_path / "t.jsonl"
    write_jsonl(str(path), lines)
    assert main(["trace", str(path)]) == 0
    rows = [line.split()[0:2] for line in capsys.readouterr().out.splitlines()[2:7]]
    assert rows == [
        ["root", "2"],
        ["└", "explore-a"],
        ["└", "grandchild"],
        ["└", "explore-b"],
        ["other", "1"],
    ]
    assert main(["trace", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    grandchild = report["sessions"][2]
    assert (grandchild["session_id"], grandchild["parent_session_id"], grandchild["depth"]) == (
        "grandchild",
        "explore-a",
        2,
    )


def test_perfetto_groups_follow_the_tree() -> None:
    doc = perfetto(parse_lines(json.dumps(x) for x in build(tree_trace())))
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    sort = {
        e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"] if e["name"] == "process_sort_index"
    }
    ordered = [names[pid] for pid in sorted(sort, key=lambda pid: sort[pid])]
    assert ordered == [
        "session root",
        "session explore-a (parent root)",
        "session grandchild (parent explore-a)",
        "session explore-b (parent root)",
        "session other",
    ]


def test_subagent_links_are_a_bounded_label() -> None:
    from agentserve.telemetry.metrics import SUBAGENT_LINKS, link_of

    cases = {
        "header:x-claude-code-parent-agent-id": "header",
        "header:x-codex-parent-thread-id": "header",
        "nvext.agent_context": "nvext",
        "billing:cc_is_subagent": "billing",
        "inferred:agent": "inferred",
        "tree": "tree",
        "explicit": "other",
        "anything-a-client-sent": "other",
    }
    assert {source: link_of(source) for source in cases} == cases
    assert link_of(None) == "other"
    assert set(cases.values()) <= set(SUBAGENT_LINKS)


def test_a_spawn_arrow_runs_from_the_parents_agent_call_to_the_childs_first_turn() -> None:
    spawning = Turn("root", 0.0, 0.1, 0.5, Usage(1000, 50, 800), calls=[Call("toolu_1", "Agent", 0.4)])
    trace = [
        spawning,
        turn("explore-a", 1.0, parent="root"),
        turn("explore-a", 2.0, parent="root"),
        turn("orphan", 2.5, parent="root-without-a-spawn-call"),
        turn("root", 3.0),
    ]
    doc = perfetto(parse_lines(json.dumps(x) for x in build(trace)))
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    arrows = [e for e in doc["traceEvents"] if e["name"] == "spawn"]
    assert [(e["ph"], names[e["pid"]]) for e in arrows] == [
        ("s", "session root"),
        ("f", "session explore-a (parent root)"),
    ]
    start, finish = arrows
    assert start["id"] == finish["id"] and start["ts"] < finish["ts"]
    # The arrow leaves at the dispatch of the Agent call (0.4 s in) and lands at the child's arrival.
    assert (start["ts"], finish["ts"]) == (400_000.0, 1_000_000.0)
