# ruff: noqa: E501 - literal model outputs read best unbroken
"""Hand-written canonical model output per family, and the assistant turn each one means.

The oracle for the fallback templates: `raw` is exactly what the model writes after the generation
prompt (end-of-turn token included, written from the documented formats in protocols.md E.*), and
`parts` is that turn as the family's parser folds it. Rendering `parts` back as history must
reproduce `raw`; `replayed` names the documented exceptions, where history by design differs.

Tool-call ids: `@0`, `@1` stand for a running call index (Kimi writes it into its ids, so a
conversation substitutes its own count); other families never write ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from agentserve.conversation import (
    Conversation,
    Message,
    Part,
    Reasoning,
    Text,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from agentserve.families import FAMILIES, Family, UnknownFamilyError, get_family
from agentserve.parsing import OutputParser, ParserOptions, sequential_call_id
from agentserve.prompt.history import events_to_message

TOOLS = (
    ToolSpec(
        "get_weather",
        "Current weather for a city.",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    ),
    ToolSpec("read", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSpec("bash", "Run a shell command.", {"type": "object", "properties": {"cmd": {"type": "string"}}}),
)

FAMILY_NAMES = (
    "qwen3",
    "qwen3-coder",
    "deepseek-r1",
    "deepseek-v3.1",
    "kimi-k2",
    "gpt-oss",
    "glm-4.5",
    "minimax-m2",
    "mistral",
    "llama3-json",
    "pythonic",
    "nemotron",
)


def R(text: str) -> Reasoning:
    return Reasoning(text)


def T(text: str) -> Text:
    return Text(text)


def C(index: int, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(f"call_@{index}", name, json.dumps(arguments))


@dataclass(frozen=True)
class Case:
    name: str
    parts: tuple[Part, ...]
    raw: str
    replayed: str | None = None  # history's rendering when it differs from `raw` by design

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCall))

    def numbered(self, base: int, kimi: bool = False) -> Case:
        """Substitute running call indices; Kimi's ids are its own `functions.NAME:IDX`."""

        def sub(text: str) -> str:
            return text.replace("@0", str(base)).replace("@1", str(base + 1))

        parts = tuple(
            ToolCall(f"functions.{p.name}:{sub(p.id[5:])}" if kimi else sub(p.id), p.name, p.arguments)
            if isinstance(p, ToolCall)
            else p
            for p in self.parts
        )
        return replace(self, parts=parts, raw=sub(self.raw), replayed=sub(self.replayed or "") or None)


CALL = (R("The user wants the weather; call the tool."), C(0, "get_weather", city="Paris"))
PARALLEL = (
    R("Two cities."),
    T("Checking both."),
    C(0, "get_weather", city="Paris"),
    C(1, "get_weather", city="Rome", days=3),
)
ANSWER = (R("Both are known now."), T("Paris is 18C and Rome is 21C."))
INTERLEAVED = (
    R("First read the file."),
    C(0, "read", path="a.py"),
    R("Then run the tests."),
    C(1, "bash", cmd="pytest"),
)

QWEN_CALL = '<tool_call>\n{{"name": "{0}", "arguments": {1}}}\n</tool_call>'


def qwen(name: str, args: str) -> str:
    return QWEN_CALL.format(name, args)


def coder(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def glm(name: str, **params: str) -> str:
    body = "".join(f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>" for k, v in params.items())
    return f"<tool_call>{name}{body}\n</tool_call>"


def invoke(name: str, **params: str) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params.items())
    return f'<invoke name="{name}">\n{body}</invoke>\n'


def ds_v3(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


def ds_v31(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


def kimi(name: str, index: str, args: str) -> str:
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


PARIS = '{"city": "Paris"}'
ROME = '{"city": "Rome", "days": 3}'
A_PY = '{"path": "a.py"}'
PYTEST = '{"cmd": "pytest"}'

KIMI_BEGIN, KIMI_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_EOS = "<｜end▁of▁sentence｜>"
HARMONY_CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.{0} <|constrain|>json<|message|>{1}<|call|>"
)

CASES: dict[str, list[Case]] = {
    "qwen3": [
        Case(
            "call",
            CALL,
            "<think>\nThe user wants the weather; call the tool.\n</think>\n\n"
            + qwen("get_weather", PARIS)
            + "<|im_end|>",
        ),
        Case(
            "parallel",
            PARALLEL,
            "<think>\nTwo cities.\n</think>\n\nChecking both.\n"
            + qwen("get_weather", PARIS)
            + "\n"
            + qwen("get_weather", ROME)
            + "<|im_end|>",
        ),
        Case(
            "answer",
            ANSWER,
            "<think>\nBoth are known now.\n</think>\n\nParis is 18C and Rome is 21C.<|im_end|>",
        ),
        Case(
            "interleaved",
            INTERLEAVED,
            "<think>\nFirst read the file.\n</think>\n\n"
            + qwen("read", A_PY)
            + "\n<think>\nThen run the tests.\n</think>\n\n"
            + qwen("bash", PYTEST)
            + "<|im_end|>",
        ),
    ],
    "qwen3-coder": [
        Case(
            "call",
            CALL,
            "<think>\nThe user wants the weather; call the tool.\n</think>\n\n"
            + coder("get_weather", city="Paris")
            + "<|im_end|>",
        ),
        Case(
            "parallel",
            PARALLEL,
            "<think>\nTwo cities.\n</think>\n\nChecking both.\n"
            + coder("get_weather", city="Paris")
            + "\n"
            + coder("get_weather", city="Rome", days="3")
            + "<|im_end|>",
        ),
        Case(
            "answer",
            ANSWER,
            "<think>\nBoth are known now.\n</think>\n\nParis is 18C and Rome is 21C.<|im_end|>",
        ),
        Case(
            "interleaved",
            INTERLEAVED,
            "<think>\nFirst read the file.\n</think>\n\n"
            + coder("read", path="a.py")
            + "\n<think>\nThen run the tests.\n</think>\n\n"
            + coder("bash", cmd="pytest")
            + "<|im_end|>",
        ),
    ],
    "nemotron": [
        Case(
            "call",
            CALL,
            '<think>\nThe user wants the weather; call the tool.\n</think>\n\n<TOOLCALL>[{"name": "get_weather", "arguments": '
            + PARIS
            + "}]</TOOLCALL><|eot_id|>",
        ),
        Case(
            "parallel",
            PARALLEL,
            '<think>\nTwo cities.\n</think>\n\nChecking both.\n<TOOLCALL>[{"name": "get_weather", "arguments": '
            + PARIS
            + '}, {"name": "get_weather", "arguments": '
            + ROME
            + "}]</TOOLCALL><|eot_id|>",
        ),
        Case(
            "answer",
            ANSWER,
            "<think>\nBoth are known now.\n</think>\n\nParis is 18C and Rome is 21C.<|eot_id|>",
        ),
        Case(
            "interleaved",
            INTERLEAVED,
            '<think>\nFirst read the file.\n</think>\n\n<TOOLCALL>[{"name": "read", "arguments": '
            + A_PY
            + '}]</TOOLCALL>\n<think>\nThen run the tests.\n</think>\n\n<TOOLCALL>[{"name": "bash", "arguments": '
            + PYTEST
            + "}]</TOOLCALL><|eot_id|>",
        ),
    ],
    # The prompt ends with <｜Assistant｜><think>\n: output starts inside reasoning.
    "deepseek-r1": [
        Case(
            "call",
            CALL,
            "The user wants the weather; call the tool.\n</think>\n\n"
            + DS_BEGIN
            + ds_v3("get_weather", PARIS)
            + DS_END
            + DS_EOS,
        ),
        Case(
            "parallel",
            PARALLEL,
            "Two cities.\n</think>\n\nChecking both."
            + DS_BEGIN
            + ds_v3("get_weather", PARIS)
            + "\n"
            + ds_v3("get_weather", ROME)
            + DS_END
            + DS_EOS,
        ),
        Case("answer", ANSWER, "Both are known now.\n</think>\n\nParis is 18C and Rome is 21C." + DS_EOS),
        Case(
            "interleaved",
            INTERLEAVED,
            "First read the file.\n</think>\n\n"
            + DS_BEGIN
            + ds_v3("read", A_PY)
            + DS_END
            + "<think>\nThen run the tests.\n</think>\n\n"
            + DS_BEGIN
            + ds_v3("bash", PYTEST)
            + DS_END
            + DS_EOS,
        ),
    ],
    # Rendered with thinking on (KWARGS): the prompt ends with <｜Assistant｜><think>.
    "deepseek-v3.1": [
        Case(
            "call",
            CALL,
            "The user wants the weather; call the tool.</think>"
            + DS_BEGIN
            + ds_v31("get_weather", PARIS)
            + DS_END
            + DS_EOS,
        ),
        Case(
            "parallel",
            PARALLEL,
            "Two cities.</think>Checking both."
            + DS_BEGIN
            + ds_v31("get_weather", PARIS)
            + ds_v31("get_weather", ROME)
            + DS_END
            + DS_EOS,
        ),
        Case("answer", ANSWER, "Both are known now.</think>Paris is 18C and Rome is 21C." + DS_EOS),
        Case(
            "interleaved",
            INTERLEAVED,
            "First read the file.</think>"
            + DS_BEGIN
            + ds_v31("read", A_PY)
            + DS_END
            + "<think>Then run the tests.</think>"
            + DS_BEGIN
            + ds_v31("bash", PYTEST)
            + DS_END
            + DS_EOS,
        ),
    ],
    "kimi-k2": [
        Case(
            "call",
            CALL,
            "<think>The user wants the weather; call the tool.</think>"
            + KIMI_BEGIN
            + kimi("get_weather", "@0", PARIS)
            + KIMI_END
            + "<|im_end|>",
        ),
        Case(
            "parallel",
            PARALLEL,
            "<think>Two cities.</think>Checking both."
            + KIMI_BEGIN
            + kimi("get_weather", "@0", PARIS)
            + kimi("get_weather", "@1", ROME)
            + KIMI_END
            + "<|im_end|>",
        ),
        Case("answer", ANSWER, "<think>Both are known now.</think>Paris is 18C and Rome is 21C.<|im_end|>"),
        Case(
            "interleaved",
            INTERLEAVED,
            "<think>First read the file.</think>"
            + KIMI_BEGIN
            + kimi("read", "@0", A_PY)
            + KIMI_END
            + "<think>Then run the tests.</think>"
            + KIMI_BEGIN
            + kimi("bash", "@1", PYTEST)
            + KIMI_END
            + "<|im_end|>",
        ),
    ],
    # The prompt ends with <|start|>assistant; one call per generation (it stops at <|call|>).
    "gpt-oss": [
        Case(
            "call",
            CALL,
            "<|channel|>analysis<|message|>The user wants the weather; call the tool.<|end|>"
            + HARMONY_CALL.format("get_weather", PARIS),
        ),
        Case(
            "preamble",
            (R("Two cities."), T("Checking both."), C(0, "get_weather", city="Paris")),
            "<|channel|>analysis<|message|>Two cities.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|>"
            + HARMONY_CALL.format("get_weather", PARIS),
        ),
        Case(
            "answer",
            ANSWER,
            "<|channel|>analysis<|message|>Both are known now.<|end|><|start|>assistant<|channel|>final<|message|>Paris is 18C and Rome is 21C.<|return|>",
            # harmony: a final message ends with <|return|> when generated, <|end|> in history
            replayed="<|channel|>analysis<|message|>Both are known now.<|end|><|start|>assistant<|channel|>final<|message|>Paris is 18C and Rome is 21C.<|end|>",
        ),
    ],
    # GLM has no end-of-turn token: the model stops by writing the next role token.
    "glm-4.5": [
        Case(
            "call",
            CALL,
            "<think>The user wants the weather; call the tool.</think>\n"
            + glm("get_weather", city="Paris")
            + "<|observation|>",
        ),
        Case(
            "parallel",
            PARALLEL,
            "<think>Two cities.</think>\nChecking both.\n"
            + glm("get_weather", city="Paris")
            + "\n"
            + glm("get_weather", city="Rome", days="3")
            + "<|observation|>",
        ),
        Case("answer", ANSWER, "<think>Both are known now.</think>\nParis is 18C and Rome is 21C.<|user|>"),
        Case(
            "interleaved",
            INTERLEAVED,
            "<think>First read the file.</think>\n"
            + glm("read", path="a.py")
            + "\n<think>Then run the tests.</think>\n"
            + glm("bash", cmd="pytest")
            + "<|observation|>",
        ),
    ],
    # The prompt ends with ]~b]ai\n<think>\n: output starts inside reasoning.
    "minimax-m2": [
        Case(
            "call",
            CALL,
            "The user wants the weather; call the tool.\n</think>\n\n<minimax:tool_call>\n"
            + invoke("get_weather", city="Paris")
            + "</minimax:tool_call>[e~[",
        ),
        Case(
            "parallel",
            PARALLEL,
            "Two cities.\n</think>\n\nChecking both.\n<minimax:tool_call>\n"
            + invoke("get_weather", city="Paris")
            + invoke("get_weather", city="Rome", days="3")
            + "</minimax:tool_call>[e~[",
        ),
        Case("answer", ANSWER, "Both are known now.\n</think>\n\nParis is 18C and Rome is 21C.[e~["),
        Case(
            "interleaved",
            INTERLEAVED,
            "First read the file.\n</think>\n\n<minimax:tool_call>\n"
            + invoke("read", path="a.py")
            + "</minimax:tool_call>\n<think>\nThen run the tests.\n</think>\n\n<minimax:tool_call>\n"
            + invoke("bash", cmd="pytest")
            + "</minimax:tool_call>[e~[",
        ),
    ],
    "mistral": [
        Case(
            "call",
            CALL,
            "[THINK]The user wants the weather; call the tool.[/THINK][TOOL_CALLS]get_weather[ARGS]"
            + PARIS
            + "</s>",
        ),
        Case(
            "parallel",
            PARALLEL,
            "[THINK]Two cities.[/THINK]Checking both.[TOOL_CALLS]get_weather[ARGS]"
            + PARIS
            + "[TOOL_CALLS]get_weather[ARGS]"
            + ROME
            + "</s>",
        ),
        Case("answer", ANSWER, "[THINK]Both are known now.[/THINK]Paris is 18C and Rome is 21C.</s>"),
        Case(
            "interleaved",
            INTERLEAVED,
            "[THINK]First read the file.[/THINK][TOOL_CALLS]read[ARGS]"
            + A_PY
            + "[THINK]Then run the tests.[/THINK][TOOL_CALLS]bash[ARGS]"
            + PYTEST
            + "</s>",
        ),
    ],
    # No reasoning block in these formats.
    "llama3-json": [
        Case(
            "call",
            (C(0, "get_weather", city="Paris"),),
            '{"name": "get_weather", "parameters": ' + PARIS + "}<|eot_id|>",
        ),
        Case(
            "parallel",
            (C(0, "get_weather", city="Paris"), C(1, "get_weather", city="Rome", days=3)),
            '{"name": "get_weather", "parameters": '
            + PARIS
            + '}; {"name": "get_weather", "parameters": '
            + ROME
            + "}<|eot_id|>",
        ),
        Case("answer", (T("Paris is 18C and Rome is 21C."),), "Paris is 18C and Rome is 21C.<|eot_id|>"),
    ],
    "pythonic": [
        Case("call", (C(0, "get_weather", city="Paris"),), '[get_weather(city="Paris")]<|eot_id|>'),
        Case(
            "parallel",
            (C(0, "get_weather", city="Paris"), C(1, "get_weather", city="Rome", days=3)),
            '[get_weather(city="Paris"), get_weather(city="Rome", days=3)]<|eot_id|>',
        ),
        Case("answer", (T("Paris is 18C and Rome is 21C."),), "Paris is 18C and Rome is 21C.<|eot_id|>"),
    ],
}

# Template arguments a family's cases are written for.
KWARGS: dict[str, dict[str, Any]] = {"deepseek-v3.1": {"enable_thinking": True}}


def cases(family: str) -> list[Case]:
    kimi_ids = family == "kimi-k2"
    return [c.numbered(0, kimi_ids) for c in CASES[family]]


def _no_parser(options: ParserOptions) -> OutputParser:
    raise LookupError("this family's parser is not registered on this branch")


def family(name: str) -> Family:
    """The registered family, or a template-only stand-in while its module is not merged."""
    try:
        return get_family(name)
    except UnknownFamilyError:
        return Family(name, "template only", make_parser=_no_parser)


def has_parser(name: str) -> bool:
    return any(f.name == name for f in FAMILIES)


SYSTEM = (Text("You are a careful assistant."),)
QUESTION = Message("user", (Text("What is the weather in Paris and Rome?"),))


def follow_up(case: Case, turn: int = 0) -> Message:
    """What comes after the turn: results of its calls, or the user's next message."""
    if case.calls:
        results = tuple(ToolResult(c.id, (Text(f"result {turn}.{i}"),)) for i, c in enumerate(case.calls))
        return Message("user", results)
    return Message("user", (Text(f"Thanks. Next question {turn}?"),))


def conversation(*messages: Message) -> Conversation:
    return Conversation(SYSTEM, (QUESTION, *messages), TOOLS)


def parse_turn(name: str, raw: str, starts_in_reasoning: bool, chunk: int = 0) -> Message:
    """Raw output → the family's parser → OutputEvents → the assistant message history carries."""
    parser = get_family(name).parser(ParserOptions(starts_in_reasoning, TOOLS, sequential_call_id))
    size = chunk or max(len(raw), 1)
    events = [e for i in range(0, len(raw), size) for e in parser.feed(raw[i : i + size])]
    return events_to_message([*events, *parser.close()])


def normalized(parts: tuple[Part, ...], keep_ids: bool) -> list[object]:
    """Parts compared by meaning: tool-call ids only where the format writes them (Kimi)."""
    out: list[object] = []
    for p in parts:
        if isinstance(p, ToolCall):
            out.append((p.id if keep_ids else "", p.name, json.loads(p.arguments)))
        else:
            out.append(p)
    return out


def agent_turn_before(name: str, case: Case) -> tuple[Message, ...]:
    """A turn without calls is checked inside an agent turn (after a call and its result), where its
    reasoning is kept; plain chat turns drop theirs once the user speaks again (test_append_only)."""
    if case.calls:
        return ()
    call = next(c for c in cases(name) if c.calls)
    return (Message("assistant", call.parts), follow_up(call))


def assert_divergence_in_date(before: str, previous_after: str, prompt_after: str) -> None:
    """The reports cut at the token boundary at or before the changed digit, inside the date (where
    exactly depends on how the tokenizer splits "2026-01-01", so only the bounds are pinned)."""
    fixed = "Today's date is 2026-01-0"
    old, new = before + previous_after, before + prompt_after
    start = old.index(fixed)
    assert old[start:].startswith(fixed + "1.") and new[start:].startswith(fixed + "2.")
    assert start + len("Today's date is") <= len(before) <= start + len(fixed)


# -- a realistic agent turn ------------------------------------------------------------------------
# Multi-line reasoning, a preamble, and two calls whose arguments carry quotes, a pipe, newlines,
# indentation and non-ASCII text, written the way each family writes them (protocols.md E.*).

EDIT = ToolSpec(
    "edit",
    "Replace text in a file.",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
        "required": ["path", "old", "new"],
    },
)
AGENT_TOOLS = (*TOOLS, EDIT)
AGENT_REASONING = "The failing test expects 2.\n\nPlan:\n1. find `f`\n2. make it return 2"
AGENT_TEXT = "Let me find it, then fix it."
GREP = {"cmd": 'grep -rn "def f" src | head -n 5'}
FIX = {"path": "src/app.py", "old": "def f():\n    return 1", "new": "def f():\n    return 2  # ✓ fixé"}


def _json(value: dict[str, str]) -> str:
    return json.dumps(value, ensure_ascii=False)  # models write non-ASCII text as it is


def _agent_raw(name: str) -> str:
    r, t, grep, fix = AGENT_REASONING, AGENT_TEXT, _json(GREP), _json(FIX)
    if name == "qwen3":
        return (
            f"<think>\n{r}\n</think>\n\n{t}\n" + qwen("bash", grep) + "\n" + qwen("edit", fix) + "<|im_end|>"
        )
    if name == "qwen3-coder":
        return (
            f"<think>\n{r}\n</think>\n\n{t}\n"
            + coder("bash", **GREP)
            + "\n"
            + coder("edit", **FIX)
            + "<|im_end|>"
        )
    if name == "nemotron":
        calls = f'[{{"name": "bash", "arguments": {grep}}}, {{"name": "edit", "arguments": {fix}}}]'
        return f"<think>\n{r}\n</think>\n\n{t}\n<TOOLCALL>{calls}</TOOLCALL><|eot_id|>"
    if name == "deepseek-r1":
        return (
            f"{r}\n</think>\n\n{t}"
            + DS_BEGIN
            + ds_v3("bash", grep)
            + "\n"
            + ds_v3("edit", fix)
            + DS_END
            + DS_EOS
        )
    if name == "deepseek-v3.1":
        return f"{r}</think>{t}" + DS_BEGIN + ds_v31("bash", grep) + ds_v31("edit", fix) + DS_END + DS_EOS
    if name == "kimi-k2":
        calls = kimi("bash", "@0", grep) + kimi("edit", "@1", fix)
        return f"<think>{r}</think>{t}" + KIMI_BEGIN + calls + KIMI_END + "<|im_end|>"
    if name == "gpt-oss":  # one call per generation: harmony stops at <|call|>
        preamble = f"<|start|>assistant<|channel|>commentary<|message|>{t}<|end|>"
        return f"<|channel|>analysis<|message|>{r}<|end|>" + preamble + HARMONY_CALL.format("edit", fix)
    if name == "glm-4.5":
        return (
            f"<think>{r}</think>\n{t}\n" + glm("bash", **GREP) + "\n" + glm("edit", **FIX) + "<|observation|>"
        )
    if name == "minimax-m2":
        calls = invoke("bash", **GREP) + invoke("edit", **FIX)
        return f"{r}\n</think>\n\n{t}\n<minimax:tool_call>\n{calls}</minimax:tool_call>[e~["
    if name == "mistral":
        return f"[THINK]{r}[/THINK]{t}[TOOL_CALLS]bash[ARGS]{grep}[TOOL_CALLS]edit[ARGS]{fix}</s>"
    if name == "llama3-json":
        return f'{{"name": "bash", "parameters": {grep}}}; {{"name": "edit", "parameters": {fix}}}<|eot_id|>'
    if name == "pythonic":
        args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in FIX.items())
        return f"[bash(cmd={json.dumps(GREP['cmd'])}), edit({args})]<|eot_id|>"
    raise KeyError(name)


def agent_case(name: str) -> Case:
    """The realistic turn for `name`; its call indices are placeholders like CASES' (`numbered`)."""
    grep, fix = ToolCall("call_@0", "bash", _json(GREP)), ToolCall("call_@1", "edit", _json(FIX))
    if name in ("llama3-json", "pythonic"):  # no reasoning block, calls only
        parts: tuple[Part, ...] = (grep, fix)
    elif name == "gpt-oss":
        parts = (R(AGENT_REASONING), T(AGENT_TEXT), ToolCall("call_@0", "edit", _json(FIX)))
    else:
        parts = (R(AGENT_REASONING), T(AGENT_TEXT), grep, fix)
    return Case("agent", parts, _agent_raw(name))
