"""Subagent trees (`frontend.subagents`): links from headers, Claude Code's billing line and spawn
calls; which children still run."""

from __future__ import annotations

import json

from agentserve.api.identity import resolve_identity
from agentserve.conversation import Conversation, Message, Text, ToolCall
from agentserve.frontend.subagents import (
    SubagentTree,
    TreeLink,
    TreeState,
    explicit_link,
    is_claude_subagent,
    opening_prompts,
    spawn_prompt,
)

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.d49; cc_entrypoint=sdk-cli;"


def user(text: str) -> Message:
    return Message("user", (Text(text),))


def new_conversation(prompt: str, system: str = "You are a file search specialist.") -> Conversation:
    return Conversation(system=(Text(system),), messages=(user(prompt),))


def agent_call(prompt: str, name: str = "Agent") -> tuple[str, str]:
    return name, json.dumps({"description": "look", "prompt": prompt, "subagent_type": "Explore"})


# -- identification ----------------------------------------------------------------------------------


def test_the_billing_line_marks_a_claude_code_subagent() -> None:
    assert is_claude_subagent((Text(BILLING + " cc_is_subagent=true;"),))
    assert is_claude_subagent((Text(BILLING + " cc_is_subagent=true;\nYou are an agent."),))
    assert not is_claude_subagent((Text(BILLING),))
    # Only the billing line counts: the words elsewhere in a prompt do not.
    assert not is_claude_subagent((Text("Explain cc_is_subagent=true; to me"),))
    assert not is_claude_subagent((Text(BILLING + "\ncc_is_subagent=true;"),))
    assert not is_claude_subagent(())


def test_codex_threads_that_ride_on_their_own_work_are_not_children() -> None:
    spawned = resolve_identity(
        {"session-id": "child", "x-codex-parent-thread-id": "root", "x-openai-subagent": "collab_spawn"}
    )
    link = explicit_link(spawned.parent_session_id, spawned.parent_source, spawned.subagent_kind)
    assert link == TreeLink("root", "header:x-codex-parent-thread-id")
    for kind in ("review", "compact", "memory_consolidation"):
        ident = resolve_identity(
            {"session-id": "t", "x-codex-parent-thread-id": "root", "x-openai-subagent": kind}
        )
        assert explicit_link(ident.parent_session_id, ident.parent_source, ident.subagent_kind) is None
    # A custom label is a spawned agent too.
    assert explicit_link("root", None, "explorer") == TreeLink("root", "explicit")
    assert explicit_link(None, None, "collab_spawn") is None


def test_claude_code_agent_headers_link_the_child() -> None:
    ident = resolve_identity(
        {
            "x-claude-code-session-id": "root",
            "x-claude-code-agent-id": "agent-2",
            "x-claude-code-parent-agent-id": "agent-1",
        }
    )
    link = explicit_link(ident.parent_session_id, ident.parent_source, ident.subagent_kind)
    assert (ident.session_id, link) == (
        "agent-2",
        TreeLink("agent-1", "header:x-claude-code-parent-agent-id"),
    )


def test_spawn_prompts_by_tool() -> None:
    assert spawn_prompt(*agent_call("find the tests")) == "find the tests"
    assert spawn_prompt(*agent_call("find the tests", name="Task")) == "find the tests"
    assert spawn_prompt("multi_agent_v1.spawn_agent", json.dumps({"message": "review a.py"})) == "review a.py"
    items = {"items": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "part two"}]}
    assert spawn_prompt("collaboration__spawn_agent", json.dumps(items)) == "part one, part two"
    assert spawn_prompt("sessions_spawn", json.dumps({"task": "summarise"})) == "summarise"
    assert spawn_prompt("Bash", json.dumps({"prompt": "not a spawn"})) is None
    assert spawn_prompt("Agent", "not json") is None
    assert spawn_prompt("Agent", json.dumps(["prompt"])) is None
    assert spawn_prompt("Agent", json.dumps({"prompt": "   "})) is None
    assert spawn_prompt("Agent", json.dumps({"prompt": 7})) is None


def test_opening_prompts_are_a_new_conversations_first_user_text_and_its_blocks() -> None:
    assert opening_prompts(new_conversation("go")) == ("go",)
    answered = Conversation(
        messages=(user("go"), Message("assistant", (ToolCall("c1", "Bash", "{}"),)), user("more"))
    )
    assert opening_prompts(answered) == ()
    assert opening_prompts(Conversation(messages=(user("  "),))) == ()
    # Claude Code 2.1.330: reminders, then the Agent call's prompt, as blocks of one user message.
    blocks = Message("user", (Text("<system-reminder>\nbe nice\n</system-reminder>"), Text("Find it.\n")))
    assert opening_prompts(Conversation(messages=(blocks,))) == (
        "<system-reminder>\nbe nice\n</system-reminder>Find it.",
        "<system-reminder>\nbe nice\n</system-reminder>",
        "Find it.",
    )


def test_a_claude_code_child_is_inferred_from_the_prompt_block() -> None:
    tree = SubagentTree()
    tree.note_spawns("k", "root", [agent_call("Find it.")], now=0.0)
    blocks = Message("user", (Text("<system-reminder>x</system-reminder>"), Text("Find it.")))
    assert tree.infer_parent("k", Conversation(messages=(blocks,)), now=1.0) == TreeLink(
        "root", "inferred:agent"
    )


# -- inference and the live tree ---------------------------------------------------------------------


def test_a_child_is_inferred_from_its_parents_spawn_call_once() -> None:
    tree = SubagentTree()
    assert tree.note_spawns("key-a", "parent", [agent_call("find the tests"), ("Bash", "{}")], now=0.0) == 1
    # Another API key's conversation with the same prompt is not this parent's child.
    assert tree.infer_parent("key-b", new_conversation("find the tests"), now=1.0) is None
    # A different prompt is not either.
    assert tree.infer_parent("key-a", new_conversation("find the docs"), now=1.0) is None
    link = tree.infer_parent("key-a", new_conversation(" find the tests\n"), now=1.0)
    assert link == TreeLink("parent", "inferred:agent")
    # The call is claimed: a second conversation with the same prompt is not linked by it.
    assert tree.infer_parent("key-a", new_conversation("find the tests"), now=1.0) is None


def test_parallel_spawns_link_one_child_each() -> None:
    tree = SubagentTree()
    tree.note_spawns("k", "p", [agent_call("same"), agent_call("same"), agent_call("other")], now=0.0)
    links = [tree.infer_parent("k", new_conversation(q), now=0.5) for q in ("same", "other", "same", "same")]
    assert [link.parent if link else None for link in links] == ["p", "p", "p", None]


def test_children_run_until_a_turn_ends_without_tool_calls() -> None:
    tree = SubagentTree()
    link = TreeLink("parent", "inferred:agent")
    tree.child_turn("c1", link, kind=11, now=0.0)
    assert tree.state("c1", now=0.0) == TreeState(parent="parent", live_siblings=0, live_children=0)
    tree.child_turn("c2", link, kind=11, now=0.1)
    tree.child_turn("c3", link, kind=22, now=0.2)  # another subagent type
    assert tree.state("c1", now=0.3) == TreeState("parent", live_siblings=1)
    assert tree.state("parent", now=0.3) == TreeState(live_children=3)
    assert tree.waiting_on_children("parent", now=0.3)
    tree.turn_ended("c1", tool_calls=True, now=1.0)  # still working
    assert tree.state("parent", now=1.0).live_children == 3
    for child in ("c1", "c2", "c3"):
        tree.turn_ended(child, tool_calls=False, now=2.0)
    assert tree.state("parent", now=2.0).live_children == 0
    assert not tree.waiting_on_children("parent", now=2.0)
    assert tree.parent_of("c1") == "parent"  # its answer is a turn of the tree still


def test_an_unclaimed_spawn_keeps_the_parent_waiting_and_everything_ages_out() -> None:
    tree = SubagentTree(ttl_s=60.0)
    tree.note_spawns("k", "p", [agent_call("go")], now=0.0)
    assert tree.waiting_on_children("p", now=10.0)
    assert not tree.waiting_on_children("p", now=61.0)
    tree.child_turn("c", TreeLink("p", "x"), kind=None, now=100.0)
    assert tree.state("p", now=150.0).live_children == 1
    assert tree.state("p", now=161.0).live_children == 0  # a child that never answers stops counting
    assert tree.parent_of("c") is None


def test_the_tree_is_bounded() -> None:
    tree = SubagentTree(max_entries=8)
    for i in range(20):
        tree.note_spawns("k", f"p{i}", [agent_call(f"q{i}")], now=float(i))
        tree.child_turn(f"c{i}", TreeLink(f"p{i}", "x"), kind=None, now=float(i))
    assert tree.infer_parent("k", new_conversation("q0"), now=20.0) is None  # dropped, oldest first
    assert tree.infer_parent("k", new_conversation("q19"), now=20.0) == TreeLink("p19", "inferred:agent")
    assert tree.parent_of("c0") is None and tree.parent_of("c19") == "p19"


def test_a_renamed_node_keeps_its_links() -> None:
    tree = SubagentTree()
    tree.child_turn("turn-one-key", TreeLink("parent-turn-one", "x"), kind=None, now=0.0)
    tree.note_spawns("k", "turn-one-key", [agent_call("grandchild task")], now=0.0)
    tree.rename("turn-one-key", "anchored")
    tree.rename("parent-turn-one", "parent-anchored")
    assert tree.parent_of("anchored") == "parent-anchored"
    assert tree.infer_parent("k", new_conversation("grandchild task"), now=1.0) == TreeLink(
        "anchored", "inferred:agent"
    )


def test_a_hold_is_due_again_only_while_children_run_and_it_runs_out() -> None:
    tree = SubagentTree()
    tree.note_spawns("k", "p", [agent_call("go")], now=0.0)
    tree.held("p", until=600.0, shared_prefix_tokens=320)
    assert tree.hold_due("p", now=100.0, margin_s=120.0) is None  # it lasts past the margin
    assert tree.hold_due("p", now=500.0, margin_s=120.0) == 320  # a spawn is still unclaimed
    link = tree.infer_parent("k", new_conversation("go"), now=500.0)
    assert link is not None
    tree.child_turn("c", link, kind=None, now=500.0)
    assert tree.hold_due("p", now=500.0, margin_s=120.0) == 320  # the child runs
    tree.turn_ended("c", tool_calls=False, now=510.0)
    assert tree.hold_due("p", now=510.0, margin_s=120.0) is None  # nothing left to wait for
    tree.held("p", until=600.0, shared_prefix_tokens=0)
    tree.resumed("p")  # the parent's next turn: the hold is over
    assert tree.hold_due("p", now=590.0, margin_s=120.0) is None
    assert tree.hold_due("unknown", now=0.0, margin_s=1.0) is None


def test_a_child_linked_by_its_headers_claims_only_its_parents_spawn() -> None:
    tree = SubagentTree()
    tree.note_spawns("k", "p1", [agent_call("same task")], now=0.0)
    tree.note_spawns("k", "p2", [agent_call("same task")], now=0.0)
    # p2's child arrives with headers: it claims p2's call, not p1's.
    assert tree.infer_parent("k", new_conversation("same task"), now=1.0, parent="p2") == TreeLink(
        "p2", "inferred:agent"
    )
    assert tree.infer_parent("k", new_conversation("same task"), now=1.0, parent="p2") is None
    # So a later header-less conversation with that prompt is p1's, and nothing is left after it.
    assert tree.infer_parent("k", new_conversation("same task"), now=1.0) == TreeLink("p1", "inferred:agent")
    assert not tree.waiting_on_children("p1", now=1.0) and not tree.waiting_on_children("p2", now=1.0)
