"""The serving path in-process, and harness clients that talk to it through the official SDKs.

`Server` is what the frontend does with one request, without sockets: decode the body with the API
codec (with the server-owned `CallMemory`), `render_prompt`, let the "model" write the next scripted
raw output, parse it with the family's parser, encode the OutputEvents with the API's stream encoder,
and answer with the SSE bytes. It keeps every turn's prompt and output for the tests.

The clients are harnesses: they keep their history in the SDK's own shapes (`model_dump()` of what the
SDK decoded from our stream, plus tool results), send all of it with every request, and never see
anything but the SDK's objects. `ChatClient(keep_reasoning=False)` drops `reasoning_content` from
history as pi and OpenClaw do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import anthropic
import httpx2
import openai

from agentserve.api.anthropic import AnthropicStreamEncoder, decode_messages
from agentserve.api.chat import ChatStreamEncoder, decode_chat
from agentserve.api.memory import CallMemory
from agentserve.api.request import DecodedRequest, ResponsesRequest
from agentserve.api.responses import ResponsesStreamEncoder, decode_responses
from agentserve.api.signing import Signer
from agentserve.api.turn import TurnAccumulator
from agentserve.conversation import Finish, Message, OutputEvent, ToolCallEnd, ToolSpec, Usage
from agentserve.families import get_family
from agentserve.parsing import ParserOptions
from agentserve.prompt.history import events_to_message
from agentserve.prompt.pipeline import PromptPipeline, RenderedPrompt, render_prompt
from agentserve.prompt.session_memory import SessionMemory
from agentserve.prompt.splice import Produced, splice_any

ApiName = Literal["anthropic", "chat", "responses"]
APIS: tuple[ApiName, ...] = ("anthropic", "chat", "responses")
SIGNER = Signer(b"round-trip-law-key-0123456789abc")
MODEL = "agentserve-test"


@dataclass(frozen=True)
class Served:
    """One request as the server saw it."""

    request: DecodedRequest
    prompt: RenderedPrompt
    raw: str  # what the model wrote
    generated: list[int]  # its tokens
    message: Message  # the parser's events folded into the turn


@dataclass
class Server:
    family: str
    api: ApiName
    pipeline: PromptPipeline
    memory: CallMemory | None = field(default_factory=CallMemory)
    enable_thinking: bool | None = None  # the deployment's default; a request may override it
    starts_in_reasoning: bool | None = None  # force the parser's start state (else: from the prompt)
    outputs: list[str] = field(default_factory=list)  # scripted model outputs, one per request
    served: list[Served] = field(default_factory=list)
    # The frontend's exact replay for this server's one session (prompt.splice), and what the
    # template rendered before it spliced (one per request).
    exact_replay: bool = False
    sessions: SessionMemory = field(default_factory=lambda: SessionMemory(lambda ids: ""))
    canonical: list[str] = field(default_factory=list)
    # A scripted output that repeats what the prompt already opened (`<think>\n` with thinking on)
    # loses that part, as the model would not write it again.
    trim_prefill: bool = False
    # Rewrites each scripted output, given whether the parser starts in reasoning (deviant whitespace).
    rewrite: Callable[[str, bool], str] | None = None

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        decoded = self.decode(json.loads(request.content))
        if self.exact_replay:
            restored = self.sessions.restore_answers("s", decoded.conversation)
            decoded = replace(decoded, conversation=restored)
        thinking = decoded.options.reasoning.enabled
        prompt = render_prompt(
            decoded.conversation,
            self.pipeline,
            enable_thinking=self.enable_thinking if thinking is None else thinking,
            template_kwargs=decoded.options.template_kwargs or None,
            reasoning_effort=decoded.options.reasoning.level,
        )
        self.canonical.append(prompt.text)
        extends = None
        if self.exact_replay:
            prompt, extends = splice_any(prompt, self.sessions.turns("s"), self.pipeline)
        raw = self.outputs.pop(0)
        if self.trim_prefill:
            raw = raw[_overlap(prompt.text, raw) :]
        starts = prompt.starts_in_reasoning if self.starts_in_reasoning is None else self.starts_in_reasoning
        if self.rewrite is not None:
            raw = self.rewrite(raw, starts)
        events = self.parse(raw, starts, decoded.conversation.tools)
        generated = self.pipeline.tokenizer.encode(raw)
        reason = "tool_calls" if any(isinstance(e, ToolCallEnd) for e in events) else "stop"
        events.append(Finish(reason, Usage(len(prompt.token_ids), len(generated))))
        if self.memory is not None:
            self.memory.remember(TurnAccumulator().feed_all(events).message())
        if self.exact_replay:
            output = self.pipeline.tokenizer.decode(generated)
            self.sessions.remember_turn(
                "s", Produced.of(self.canonical[-1], prompt, generated, output), extends
            )
            self.sessions.remember_answer("s", TurnAccumulator().feed_all(events).message())
        self.served.append(Served(decoded, prompt, raw, generated, events_to_message(events)))
        return httpx2.Response(
            200,
            content=self.encode(decoded, events),
            headers={"content-type": "text/event-stream; charset=utf-8"},
        )

    def decode(self, body: Any) -> DecodedRequest:
        if self.api == "anthropic":
            return decode_messages(body, memory=self.memory, signer=SIGNER)
        if self.api == "chat":
            return decode_chat(body, memory=self.memory)
        return decode_responses(body, signer=SIGNER)

    def parse(self, raw: str, starts_in_reasoning: bool, tools: tuple[ToolSpec, ...]) -> list[OutputEvent]:
        turn = len(self.served)
        # Unique, unguessable-looking ids per turn, deterministic for the test (the server's are random).
        options = ParserOptions(starts_in_reasoning, tools, lambda i: f"call_{turn:02d}{i:02d}{'ab' * 10}")
        parser = get_family(self.family).parser(options)
        return [*parser.feed(raw), *parser.close()]

    def encode(self, request: DecodedRequest, events: list[OutputEvent]) -> bytes:
        encoder: AnthropicStreamEncoder | ChatStreamEncoder | ResponsesStreamEncoder
        if self.api == "anthropic":
            encoder = AnthropicStreamEncoder(MODEL, signer=SIGNER)
        elif self.api == "chat":
            encoder = ChatStreamEncoder(MODEL)
        else:
            assert isinstance(request, ResponsesRequest)
            encoder = ResponsesStreamEncoder(request, signer=SIGNER)
        return encoder.start() + b"".join(encoder.feed(e) for e in events)


def _overlap(prompt: str, raw: str) -> int:
    """Length of the longest suffix of `prompt` that `raw` starts with (what the prompt prefilled)."""
    for n in range(min(len(prompt), len(raw), 64), 0, -1):
        if raw.startswith(prompt[-n:]):
            return n
    return 0


# What each API's client sends to ask for reasoning (Claude Code, pi, Codex).
EFFORT: dict[str, dict[str, Any]] = {
    "anthropic": {"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},
    "chat": {"reasoning_effort": "medium"},
    "responses": {"reasoning": {"effort": "medium", "summary": "auto"}},
}


def _http(server: Server) -> httpx2.Client:
    return httpx2.Client(transport=httpx2.MockTransport(server))


CallRef = tuple[str, str]  # (the call id as the client sees it, the tool name)


class AnthropicClient:
    """Claude Code's way: thinking blocks (with signatures), text and tool_use blocks sent back as
    the SDK decoded them; tool results as tool_result blocks in the next user message."""

    def __init__(
        self,
        server: Server,
        system: str,
        tools: tuple[ToolSpec, ...],
        question: str,
        *,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.extra = extra or {}
        self.sdk = anthropic.Anthropic(
            api_key="k", base_url="http://agentserve.test", http_client=_http(server), max_retries=0
        )
        self.system = [{"type": "text", "text": system}]
        self.tools = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
        ]
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": question}]

    def send(self) -> list[CallRef]:
        with self.sdk.messages.stream(
            model=MODEL,
            max_tokens=4096,
            system=self.system,  # type: ignore[arg-type]
            tools=self.tools,  # type: ignore[arg-type]
            messages=self.messages,  # type: ignore[arg-type]
            extra_body=self.extra,
        ) as stream:
            final = stream.get_final_message()
        content = [block.model_dump(exclude_none=True) for block in final.content]
        self.messages.append({"role": "assistant", "content": content})
        return [(b.id, b.name) for b in final.content if b.type == "tool_use"]

    def results(self, calls: list[CallRef], texts: list[str]) -> None:
        blocks = [
            {"type": "tool_result", "tool_use_id": call_id, "content": text}
            for (call_id, _), text in zip(calls, texts, strict=True)
        ]
        self.messages.append({"role": "user", "content": blocks})

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


class ChatClient:
    """An OpenAI-compatible agent (pi, OpenClaw, opencode): the SDK's accumulated assistant message,
    `reasoning_content` kept or dropped, then one `tool` message per result."""

    def __init__(
        self,
        server: Server,
        system: str,
        tools: tuple[ToolSpec, ...],
        question: str,
        *,
        keep_reasoning: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.extra = extra or {}
        self.sdk = openai.OpenAI(
            api_key="k", base_url="http://agentserve.test/v1", http_client=_http(server), max_retries=0
        )
        self.keep_reasoning = keep_reasoning
        self.tools = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in tools
        ]
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]

    def send(self) -> list[CallRef]:
        with self.sdk.chat.completions.stream(
            model=MODEL,
            messages=self.messages,  # type: ignore[arg-type]
            tools=self.tools,  # type: ignore[arg-type]
            extra_body=self.extra,
        ) as stream:
            message = stream.get_final_completion().choices[0].message
        # The SDK's own assistant message, minus what only its helper adds (parsed, index).
        dumped = message.model_dump(
            exclude_none=True,
            exclude={
                "parsed": True,
                "tool_calls": {"__all__": {"index": True, "function": {"parsed_arguments"}}},
            },
        )
        if not self.keep_reasoning:
            dumped.pop("reasoning_content", None)
            dumped.pop("reasoning", None)
        self.messages.append(dumped)
        return [(c.id, c.function.name) for c in message.tool_calls or []]

    def results(self, calls: list[CallRef], texts: list[str]) -> None:
        for (call_id, _), text in zip(calls, texts, strict=True):
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


class ResponsesClient:
    """Codex's way: stateless (`store: false`), every output item sent back as the SDK decoded it
    (reasoning with its sealed `encrypted_content`), then `function_call_output` items."""

    def __init__(
        self,
        server: Server,
        system: str,
        tools: tuple[ToolSpec, ...],
        question: str,
        *,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.extra = extra or {}
        self.sdk = openai.OpenAI(
            api_key="k", base_url="http://agentserve.test/v1", http_client=_http(server), max_retries=0
        )
        self.instructions = system
        self.tools = [
            {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
            for t in tools
        ]
        self.input: list[dict[str, Any]] = [{"role": "user", "content": question}]

    def send(self) -> list[CallRef]:
        with self.sdk.responses.stream(
            model=MODEL,
            instructions=self.instructions,
            input=self.input,  # type: ignore[arg-type]
            tools=self.tools,  # type: ignore[arg-type]
            store=False,
            include=["reasoning.encrypted_content"],
            extra_body=self.extra,
        ) as stream:
            final = stream.get_final_response()
        self.input += [item.model_dump(exclude_none=True) for item in final.output]
        return [(o.call_id, o.name) for o in final.output if o.type == "function_call"]

    def results(self, calls: list[CallRef], texts: list[str]) -> None:
        for (call_id, _), text in zip(calls, texts, strict=True):
            self.input.append({"type": "function_call_output", "call_id": call_id, "output": text})

    def user(self, text: str) -> None:
        self.input.append({"role": "user", "content": text})


Client = AnthropicClient | ChatClient | ResponsesClient


def client_for(
    api: ApiName, server: Server, system: str, tools: tuple[ToolSpec, ...], question: str, **options: Any
) -> Client:
    if api == "anthropic":
        return AnthropicClient(server, system, tools, question, **options)
    if api == "chat":
        return ChatClient(server, system, tools, question, **options)
    return ResponsesClient(server, system, tools, question, **options)
