"""Clients that send no session id (pi, OpenClaw) get one from their conversation (issue 18, item 3):
traces group by it, drift is detected under it, and two conversations that start alike stay apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest
from sim_scenarios import CHAT_TOOLS, QWEN3_DEFAULT, QWEN3_RULES, write_scenario
from stack import served

PI_SYSTEM = "You are pi, a coding agent.\nCurrent date: 2026-11-21"
PROMPT = "run echo hello using your shell tool, then say done"


def turn(o: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    message = o.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS).choices[0].message  # type: ignore[arg-type]
    # pi keeps content and tool calls (arguments re-serialised), drops reasoning.
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.function.name,
                    "arguments": json.dumps(json.loads(c.function.arguments)),
                },
            }
            for c in message.tool_calls
        ]
    return out


def test_conversations_without_a_session_header_get_their_own_key(
    tmp_path: Path,
) -> None:
    scenario = write_scenario(tmp_path, QWEN3_RULES, QWEN3_DEFAULT)
    sink = tmp_path / "trace.jsonl"
    with served({"script": scenario, "trace_sink": str(sink)}) as s:
        o = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        # Two pi sessions in one project, interleaved: same system prompt, tools and first prompt.
        histories: list[list[dict[str, Any]]] = [
            [{"role": "system", "content": PI_SYSTEM}, {"role": "user", "content": PROMPT}] for _ in range(2)
        ]
        for h in histories:
            h.append(turn(o, h))
        for h in histories:
            call = h[-1]["tool_calls"][0]
            h.append({"role": "tool", "tool_call_id": call["id"], "content": "hello\n"})
            h.append(turn(o, h))
        for h in histories:
            h.append({"role": "user", "content": "thanks"})
            h.append(turn(o, h))
        histories[0].append({"role": "user", "content": "once more"})
        turn(o, histories[0])

    records = [json.loads(line) for line in sink.read_text().splitlines()]
    requests = [r for r in records if r["event_type"] == "request_end"]
    sessions = [r["agent_context"]["session_id"] for r in requests]
    sources = {r["agent_context"]["source"] for r in requests}
    assert sources == {"conversation"} and all(k.startswith("conv-") for k in sessions)
    first_a, first_b, second_a, second_b, third_a, third_b, fourth_a = sessions
    # Stable from turn 1 on: turn 1's record carries the key its reply anchored (`key_after`)...
    assert first_a == second_a == third_a == fourth_a and first_b == second_b == third_b
    assert first_a != first_b  # ...and the two conversations, which started alike, never merge
    # Drift is tracked per conversation, and every later turn extended its own previous turn (the
    # answer whose reasoning pi dropped included: exact replay puts it back)...
    for r in requests[2:6]:
        drift = r["request"]["drift"]
        assert drift is not None and not drift["drifted"], drift
    # ...except where the template drops reasoning by design: a plain chat turn ("thanks" → "All
    # done.") before a new user message. The drift is found under the conversation's key.
    last = requests[6]["request"]["drift"]
    assert last["drifted"] and last["reusable_tokens"] < last["previous_tokens"]


# A model that writes its own whitespace: one newline after </think> (the template has two) and a
# space before its call.
DEVIANT_RULES = [
    {"match": "^hello", "output": "<think>\nIt printed hello.\n</think>\ndone.<|im_end|>"},
    {
        "turn": 1,
        "output": "<think>\nRun it.\n</think>\n <tool_call>\n"
        '{"name": "Bash", "arguments": {"command": "echo hello"}}\n</tool_call><|im_end|>',
    },
]
DEVIANT_DEFAULT = "<think>\nNothing left.\n</think>\nAll done.<|im_end|>"


@pytest.mark.parametrize("exact_replay", [True, False])
def test_exact_replay_keeps_a_deviant_models_turns_append_only(tmp_path: Path, exact_replay: bool) -> None:
    scenario = write_scenario(tmp_path, DEVIANT_RULES, DEVIANT_DEFAULT)
    sink = tmp_path / "trace.jsonl"
    with served({"script": scenario, "trace_sink": str(sink), "exact_replay": exact_replay}) as s:
        o = openai.OpenAI(base_url=s.url + "/v1", api_key="k", max_retries=0)
        history: list[dict[str, Any]] = [
            {"role": "system", "content": PI_SYSTEM},
            {"role": "user", "content": PROMPT},
        ]
        history.append(turn(o, history))
        call = history[-1]["tool_calls"][0]
        history.append({"role": "tool", "tool_call_id": call["id"], "content": "hello\n"})
        history.append(turn(o, history))  # "done." (its reasoning dropped by the client)
        history.append({"role": "user", "content": "and now?"})
        turn(o, history)
    requests = [json.loads(x) for x in sink.read_text().splitlines()]
    drifts = [r["request"]["drift"] for r in requests if r["event_type"] == "request_end"][1:]
    assert len(drifts) == 2 and all(d is not None for d in drifts)
    if exact_replay:
        assert not any(d["drifted"] for d in drifts), drifts
    else:  # the template's whitespace rewrites the model's turn: the prefix breaks every turn
        assert all(d["drifted"] for d in drifts), drifts
