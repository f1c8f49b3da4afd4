"""What Responses decoding and encoding share: freeform tools as functions, the response store."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from agentserve.api.request import ResponsesRequest
from agentserve.conversation import (
    Message,
)

CUSTOM_INPUT = "input"  # the one argument of a freeform tool offered as a function


def custom_tool_parameters(description: str = "") -> dict[str, Any]:
    prop: dict[str, Any] = {"type": "string"}
    if description:
        prop["description"] = description
    return {"type": "object", "properties": {CUSTOM_INPUT: prop}, "required": [CUSTOM_INPUT]}


def custom_input(arguments: str) -> str:
    """The freeform input inside a custom call's arguments (the raw text if they are not that shape)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]  # type: ignore[no-any-return]
    return arguments


class ResponseStore:
    """Bounded memory of stored responses (`store: true`) for `previous_response_id`."""

    __slots__ = ("_items", "_max")

    def __init__(self, max_responses: int = 1024) -> None:
        self._max = max_responses
        self._items: OrderedDict[str, tuple[Message, ...]] = OrderedDict()

    def put(self, response_id: str, history: tuple[Message, ...]) -> None:
        self._items[response_id] = history
        self._items.move_to_end(response_id)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> tuple[Message, ...] | None:
        history = self._items.get(response_id)
        if history is not None:
            self._items.move_to_end(response_id)
        return history

    def remember(self, request: ResponsesRequest, response_id: str, turn: Message) -> None:
        """After a completed response: its whole history (input + output) under its id, if stored."""
        if request.store:
            self.put(response_id, (*request.conversation.messages, turn))
