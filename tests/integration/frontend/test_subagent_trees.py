"""Subagent trees end to end (issue 29): `agentserve up` with the qwen3 sim scripted to spawn two
subagents through Claude Code's Agent tool. One child comes as Claude Code before ~2.1.234 sends it
(the parent's session id, `cc_is_subagent=true` in the billing line), the other with no identity at
all (linked by inference from the spawn call). The traces show both links; the children's blocks sit
in the child class of the sim's pool; and every reply is byte for byte what the same run with the
feature off returns (a link changes retention and placement, never a reply)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from sim_scenarios import BASH, END, READ, qwen_call, think, write_scenario
from stack import Served, served

from agentserve.worker.engines.sim import SimEngine

ROOT = "6f1c2a9e-root-session"
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=cli;"
AGENT_TOOL = {
    "name": "Agent",
    "description": "Launch a new agent to handle a task autonomously.",
    "input_schema": {
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "prompt": {"type": "string"},
            "subagent_type": {"type": "string"},
        },
        "required": ["description", "prompt", "subagent_type"],
    },
}
TESTS_TASK = "Find where the tests live and list them."
DOCS_TASK = "Find the docs and summarise their layout."
RULES = [
    {
        "match": "^PLAN",
        "output": think("Two explorers in parallel.")
        + qwen_call("Agent", {"description": "tests", "prompt": TESTS_TASK, "subagent_type": "Explore"})
        + "\n"
        + qwen_call("Agent", {"description": "docs", "prompt": DOCS_TASK, "subagent_type": "Explore"})
        + END,
    },
    {"match": "^Find", "output": think("Look around.") + qwen_call("Bash", {"command": "ls -R"}) + END},
    {"match": "^LISTING", "output": think("Got it.") + "Found them: tests/ and docs/." + END},
    {"match": "^REPORT", "output": think("Both agents answered.") + "All done." + END},
]
EXPLORE_SYSTEM = "You are a file search specialist for Claude Code. " + "Search thoroughly. " * 40
MAIN_SYSTEM = "You are Claude Code, an interactive CLI tool. " + "Be careful. " * 40
_IDS = re.compile(rb"\b(msg|toolu|req|call)_[A-Za-z0-9]+")


def post(client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
    r = client.post("/v1/messages", json={"model": "m", "max_tokens": 512, **body}, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.content


def blocks(raw: bytes) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = json.loads(raw)["content"]
    return content


def stream_tool_uses(raw: bytes) -> list[dict[str, Any]]:
    """The tool_use blocks of an Anthropic SSE stream, arguments joined."""
    uses: dict[int, dict[str, Any]] = {}
    for line in raw.decode().splitlines():
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            uses[event["index"]] = {**event["content_block"], "json": ""}
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta":
            uses[event["index"]]["json"] += event["delta"]["partial_json"]
    return [{**u, "input": json.loads(u.pop("json"))} for u in uses.values()]


def child_turns(
    client: httpx.Client, task: str, system: list[dict[str, str]], headers: dict[str, str], *, stream: bool
) -> list[bytes]:
    """A subagent: it runs one tool, then answers."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    tools = [BASH, READ]
    first = post(client, {"system": system, "messages": messages, "tools": tools, "stream": stream}, headers)
    uses = stream_tool_uses(first) if stream else [b for b in blocks(first) if b["type"] == "tool_use"]
    assert len(uses) == 1, first
    call = {"type": "tool_use", "id": uses[0]["id"], "name": uses[0]["name"], "input": uses[0]["input"]}
    messages += [
        {"role": "assistant", "content": [call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "LISTING a b"}],
        },
    ]
    second = post(client, {"system": system, "messages": messages, "tools": tools, "stream": stream}, headers)
    return [first, second]


def run_tree(s: Served) -> list[bytes]:
    """The parent spawns two children, both answer, the parent resumes: every raw reply, in order."""
    parent_headers = {"x-claude-code-session-id": ROOT}
    main_system = [{"type": "text", "text": BILLING}, {"type": "text", "text": MAIN_SYSTEM}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "PLAN the exploration of this repo"}]
    with httpx.Client(base_url=s.url, headers={"x-api-key": "k"}, timeout=30) as client:
        spawn = post(
            client, {"system": main_system, "messages": messages, "tools": [AGENT_TOOL, BASH]}, parent_headers
        )
        calls = [b for b in blocks(spawn) if b["type"] == "tool_use"]
        assert [c["input"]["prompt"] for c in calls] == [TESTS_TASK, DOCS_TASK]
        # Child 1: Claude Code before agent ids — the parent's session id and the billing flag.
        sub_billing = BILLING + " cc_is_subagent=true;"
        explore = [{"type": "text", "text": sub_billing}, {"type": "text", "text": EXPLORE_SYSTEM}]
        tests_child = child_turns(client, TESTS_TASK, explore, parent_headers, stream=False)
        # Child 2: nothing names it (a harness with no session header): inferred from the spawn call.
        docs_child = child_turns(
            client, DOCS_TASK, [{"type": "text", "text": EXPLORE_SYSTEM}], {}, stream=True
        )
        messages += [
            {
                "role": "assistant",
                "content": [{k: c[k] for k in ("type", "id", "name", "input")} for c in calls],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": c["id"],
                        "content": "REPORT: found tests/ and docs/",
                    }
                    for c in calls
                ],
            },
        ]
        resume = post(
            client, {"system": main_system, "messages": messages, "tools": [AGENT_TOOL, BASH]}, parent_headers
        )
    return [spawn, *tests_child, *docs_child, resume]


def pool_classes(s: Served) -> set[int]:
    classes: set[int] = set()
    for engine in s.backend.engines.values():
        assert isinstance(engine, SimEngine)
        for h in engine.pool.snapshot().block_hashes:
            prio = engine.pool.priority_of(h)
            if prio is not None:
                classes.add(prio)
    return classes


def requests_of(sink: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in sink.read_text().splitlines()]
    return [r for r in records if r["event_type"] == "request_end"]


def test_the_tree_is_linked_in_traces_and_replies_do_not_change(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, RULES, think("Nothing left.") + "Done." + END)
    key = tmp_path / "signing.key"
    key.write_text("00" * 32)  # both runs sign thinking blocks alike
    replies: dict[bool, list[bytes]] = {}
    classes: dict[bool, set[int]] = {}
    for trees in (True, False):
        sink = tmp_path / f"trace-{trees}.jsonl"
        settings = {"script": scenario, "trace_sink": str(sink), "subagent_trees": trees, "workers": 1}
        with served(settings | {"signing_key_file": str(key)}) as s:
            replies[trees] = run_tree(s)
            s.call(s.frontend.retention_updates_done())
            classes[trees] = pool_classes(s)
            metrics = httpx.get(s.url + "/metrics").text
        links = {
            link: sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith(f'agentserve_frontend_subagent_requests_total{{link="{link}"}}')
            )
            for link in ("billing", "inferred", "tree")
        }
        # On: the billing-line child's two turns, the inferred child's first and (linked) second.
        assert links == (
            {"billing": 2.0, "inferred": 1.0, "tree": 1.0} if trees else dict.fromkeys(links, 0.0)
        )
        ctx = [r["agent_context"] for r in requests_of(sink)]
        assert len(ctx) == 6
        if not trees:
            # Off: Claude Code's first child is recorded under its parent's session id, unlinked.
            assert all(c["parent_session_id"] is None for c in ctx)
            continue
        spawn, tests_1, tests_2, docs_1, docs_2, resume = ctx
        assert spawn["session_id"] == resume["session_id"] == ROOT
        assert spawn["parent_session_id"] is None and resume["parent_session_id"] is None
        # The billing-line child is its own conversation under the root, stable across its turns.
        assert tests_1["session_id"] == tests_2["session_id"] != ROOT
        assert tests_1["parent_session_id"] == tests_2["parent_session_id"] == ROOT
        assert tests_1["parent_source"] == tests_2["parent_source"] == "billing:cc_is_subagent"
        # The header-less child: inferred from the Agent call whose prompt opened it.
        assert docs_1["session_id"] == docs_2["session_id"] != tests_1["session_id"]
        assert docs_1["parent_session_id"] == docs_2["parent_session_id"] == ROOT
        assert docs_1["parent_source"] == "inferred:agent"
    # What the clients received is the same bytes (ids aside: they are random per response). The
    # pool has room for everything here, so even the cached-token counts in `usage` agree.
    assert [_IDS.sub(b"ID", r) for r in replies[True]] == [_IDS.sub(b"ID", r) for r in replies[False]]
    # Only retention differs: the answered children's own blocks were released to the lowest class
    # (their type's prefix stays at the prefix class for siblings); off, every agent block is at 80.
    assert {0, 80, 90} <= classes[True], classes
    assert 0 not in classes[False] and 80 in classes[False], classes


def test_a_parent_that_spawned_is_held_above_the_session_class(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, RULES, think("Nothing left.") + "Done." + END)
    main_system = [{"type": "text", "text": BILLING}, {"type": "text", "text": MAIN_SYSTEM}]
    body = {
        "system": main_system,
        "messages": [{"role": "user", "content": "PLAN the exploration of this repo"}],
        "tools": [AGENT_TOOL, BASH],
    }
    for trees in (True, False):
        with served({"script": scenario, "subagent_trees": trees, "workers": 1}) as s:
            with httpx.Client(base_url=s.url, headers={"x-api-key": "k"}, timeout=30) as client:
                post(client, body, {"x-claude-code-session-id": ROOT})
            s.call(s.frontend.retention_updates_done())
            # Held: the parent's own blocks (prompt after the shared prefix, and its Agent calls).
            assert (85 in pool_classes(s)) is trees


def test_session_control_close_releases_and_bad_controls_are_the_apis_own_400(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path, RULES, think("Nothing left.") + "Done." + END)
    explore = [{"type": "text", "text": EXPLORE_SYSTEM}]
    body = {"system": explore, "messages": [{"role": "user", "content": "Find it"}], "tools": [BASH]}
    with served({"script": scenario, "workers": 1}) as s, httpx.Client(base_url=s.url, timeout=30) as client:
        control = {"session_id": "explorer-1", "parent_session_id": "lead", "action": "close"}
        post(client, body | {"nvext": {"session_control": control}})
        s.call(s.frontend.retention_updates_done())
        assert 0 in pool_classes(s)  # closed: its own blocks went to the lowest class at once
        bad = body | {"nvext": {"session_control": {"action": "destroy"}}}
        r = client.post("/v1/messages", json={"model": "m", "max_tokens": 16, **bad})
        assert r.status_code == 400
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
        assert "nvext.session_control.action" in r.text


def test_a_codex_child_sharing_its_roots_session_id_is_keyed_by_its_thread(tmp_path: Path) -> None:
    """Codex 0.169 (captured): a spawned child sends the root's `session-id`, its own `thread-id`,
    `x-codex-parent-thread-id` and `x-openai-subagent: collab_spawn`."""
    scenario = write_scenario(tmp_path, RULES, think("Nothing left.") + "Done." + END)
    sink = tmp_path / "trace.jsonl"
    root, child = "01a21c1d-root", "01a21c1d-child"
    body = {"model": "m", "input": "Find the tests please", "tools": [], "stream": False}
    child_headers = {
        "session-id": root,
        "thread-id": child,
        "x-codex-parent-thread-id": root,
        "x-openai-subagent": "collab_spawn",
    }
    with (
        served({"script": scenario, "trace_sink": str(sink), "workers": 1}) as s,
        httpx.Client(base_url=s.url, timeout=30) as client,
    ):
        for headers in ({"session-id": root, "thread-id": root}, child_headers, child_headers):
            r = client.post("/v1/responses", json=body, headers=headers)
            assert r.status_code == 200, r.text
    ctx = [r["agent_context"] for r in requests_of(sink)]
    assert [(c["session_id"], c["parent_session_id"]) for c in ctx] == [
        (root, None),
        (child, root),
        (child, root),
    ]
    assert ctx[1]["parent_source"] == "header:x-codex-parent-thread-id"
