"""Shared machinery of the streaming output parsers (sans-IO; see `stream.StreamParser`)."""

from agentserve.parsing.stream import (
    BlockContext,
    BlockFactory,
    OutputParser,
    ParserOptions,
    StreamParser,
    Syntax,
    ToolBlock,
)
from agentserve.parsing.toolcalls import ToolCalls, random_call_id, sequential_call_id

__all__ = [
    "BlockContext",
    "BlockFactory",
    "OutputParser",
    "ParserOptions",
    "StreamParser",
    "Syntax",
    "ToolBlock",
    "ToolCalls",
    "random_call_id",
    "sequential_call_id",
]
