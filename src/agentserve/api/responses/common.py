"""What Responses decoding and encoding share: freeform tools as functions, the response store."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from agentserve.api.custom_format import CUSTOM_INPUT
from agentserve.api.request import ResponsesRequest
from agentserve.conversation import Message, Text


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
    """Bounded memory of stored responses (`store: true`) for `previous_response_id`.

    A response's history is its input's messages plus its output turn, and the system text that came
    from its input items (developer/system messages); `instructions` do not carry over, as on the
    real API.
    """

    __slots__ = ("_items", "_max")

    def __init__(self, max_responses: int = 1024) -> None:
        self._max = max_responses
        self._items: OrderedDict[str, tuple[tuple[Text, ...], tuple[Message, ...]]] = OrderedDict()

    def put(
        self, response_id: str, history: tuple[Message, ...], system: tuple[Text, ...] = (), scope: str = ""
    ) -> None:
        key = scope + "\0" + response_id
        self._items[key] = (system, history)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def _entry(self, response_id: str, scope: str) -> tuple[tuple[Text, ...], tuple[Message, ...]] | None:
        key = scope + "\0" + response_id
        entry = self._items.get(key)
        if entry is not None:
            self._items.move_to_end(key)
        return entry

    def __contains__(self, scoped: tuple[str, str]) -> bool:
        """`(scope, response_id) in store` (no recency update)."""
        return scoped[0] + "\0" + scoped[1] in self._items

    def get(self, response_id: str, scope: str = "") -> tuple[Message, ...] | None:
        """The stored history, only for the scope (API key) that stored it."""
        entry = self._entry(response_id, scope)
        return None if entry is None else entry[1]

    def system(self, response_id: str, scope: str = "") -> tuple[Text, ...]:
        """The system text the stored response's input items carried (empty if unknown)."""
        entry = self._entry(response_id, scope)
        return () if entry is None else entry[0]

    def drop(self, response_id: str, scope: str = "") -> bool:
        return self._items.pop(scope + "\0" + response_id, None) is not None

    def remember(self, request: ResponsesRequest, response_id: str, turn: Message, scope: str = "") -> None:
        """After a completed response: its whole history (input + output) under its id, if stored."""
        if request.store:
            system = request.conversation.system
            if request.instructions:  # the first system text; it does not carry over
                system = system[1:]
            self.put(response_id, (*request.conversation.messages, turn), system, scope)
