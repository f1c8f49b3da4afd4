"""Cost of the API codecs on the hot path: request decoding and per-event stream encoding.

    PYTHONPATH=src:. python bench/api_codecs.py

Bodies are shaped like the harness captures (Claude Code: 24 tools and ~19K tokens; Codex and pi
tool loops), replayed with a growing history; encoders are fed a realistic token-sized event mix.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

from tests.unit.api.harness_bodies import BASH_TOOL, claude_code_turn1, codex_turn1, pi_turn1

from agentserve.api import (
    AnthropicStreamEncoder,
    CallMemory,
    ChatStreamEncoder,
    ResponsesStreamEncoder,
    Signer,
    decode_chat,
    decode_messages,
    decode_responses,
)
from agentserve.conversation import (
    Finish,
    OutputEvent,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

SIGNER = Signer(b"b" * 32)


def timed(fn: Callable[[], Any], repeat: int, rounds: int = 5) -> float:
    """Best mean over `rounds` batches: the machine is shared, the minimum is the cost."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best


def claude_body(turns: int) -> dict[str, Any]:
    body = claude_code_turn1()
    body["system"][2]["text"] *= 80  # ~6K chars of instructions, as captured
    body["tools"] = [
        dict(copy.deepcopy(BASH_TOOL), name=f"Tool{i}", description="d " * 600) for i in range(24)
    ]
    for i in range(turns):
        body["messages"] += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "plan " * 60, "signature": "sig"},
                {"type": "tool_use", "id": f"toolu_{i:024x}", "name": "Tool0",
                 "input": {"command": f"ls {i}"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{i:024x}", "content": "x" * 400}]},
        ]  # fmt: skip
    return body


def chat_body(turns: int) -> dict[str, Any]:
    body = pi_turn1()
    for i in range(turns):
        call = {
            "id": f"call_{i:024x}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command":"ls"}'},
        }
        body["messages"] += [
            {"role": "assistant", "content": "ok", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "x" * 400},
        ]
    return body


def responses_body(turns: int) -> dict[str, Any]:
    body = codex_turn1()
    for i in range(turns):
        body["input"] += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": [],
             "content": [{"type": "reasoning_text", "text": "plan " * 60}]},
            {"type": "function_call", "id": f"fc_{i}", "call_id": f"call_{i}", "name": "exec_command",
             "arguments": '{"cmd":"ls"}'},
            {"type": "function_call_output", "call_id": f"call_{i}", "output": "x" * 400},
        ]  # fmt: skip
    return body


def events(n_tokens: int) -> list[OutputEvent]:
    """A turn of about n_tokens events: reasoning, a call with streamed arguments, text."""
    third = n_tokens // 3
    out: list[OutputEvent] = [ReasoningDelta(" word") for _ in range(third)] + [ReasoningEnd()]
    out.append(ToolCallStart(0, "call_" + "a" * 24, "exec_command"))
    out += [ToolCallArgsDelta(0, '{"cmd": "') for _ in range(1)] + [
        ToolCallArgsDelta(0, "x") for _ in range(third)
    ]
    out += [ToolCallArgsDelta(0, '"}'), ToolCallEnd(0, '{"cmd": "' + "x" * third + '"}')]
    out += [TextDelta(" word") for _ in range(third)]
    out.append(Finish("tool_calls", Usage(20000, n_tokens, 19000, third)))
    return out


def main() -> None:
    print("decode (µs per request; json.loads of the same body for scale)")
    request = decode_responses({"model": "m", "input": "x"}, signer=SIGNER)
    decoders: list[tuple[str, Callable[[int], dict[str, Any]], Callable[[Any], Any]]] = [
        ("anthropic", claude_body, lambda b: decode_messages(b, memory=CallMemory())),
        ("chat", chat_body, lambda b: decode_chat(b, memory=CallMemory())),
        ("responses", responses_body, lambda b: decode_responses(b, signer=SIGNER)),
    ]
    for name, make, decode in decoders:
        for turns in (0, 20, 100):
            body = make(turns)
            raw = json.dumps(body)
            t_decode = timed(lambda decode=decode, body=body: decode(body), 50)  # type: ignore[misc]
            t_json = timed(lambda raw=raw: json.loads(raw), 50)  # type: ignore[misc]
            size = f"{len(raw) / 1024:7.1f} KiB"
            print(
                f"  {name:10} {turns:4} turns {size}  decode {t_decode * 1e6:8.1f}  json {t_json * 1e6:8.1f}"
            )

    print("encode (µs per OutputEvent, streaming)")
    evs = events(3000)
    for name, make_encoder in (
        ("anthropic", lambda: AnthropicStreamEncoder("m", signer=SIGNER)),
        ("chat", lambda: ChatStreamEncoder("m", include_usage=True)),
        ("responses", lambda: ResponsesStreamEncoder(request, signer=SIGNER)),
    ):

        def run(make_encoder: Callable[[], Any] = make_encoder) -> None:
            encoder = make_encoder()
            for e in evs:
                encoder.feed(e)

        print(f"  {name:10} {timed(run, 5) / len(evs) * 1e6:6.2f}")


if __name__ == "__main__":
    main()
