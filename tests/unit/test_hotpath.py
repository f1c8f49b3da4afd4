"""`fast_init`: the same constructor as the dataclass's, frozen still."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentserve.conversation import TextDelta
from agentserve.hotpath import fast_init
from agentserve.worker.engine import Step


@dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str = "b"
    c: tuple[int, ...] | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Fast:
    a: int
    b: str = "b"
    c: tuple[int, ...] | None = None


def test_same_signature_and_values_as_the_dataclass() -> None:
    assert str(inspect.signature(Fast)) == str(inspect.signature(Plain))
    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((1,), {}),
        ((1, "x"), {}),
        ((1,), {"c": (2,)}),
        ((), {"a": 3, "b": "y", "c": None}),
    ]
    for args, kwargs in cases:
        fast, plain = Fast(*args, **kwargs), Plain(*args, **kwargs)
        assert dataclasses.astuple(fast) == dataclasses.astuple(plain)
        assert repr(fast).removeprefix("Fast") == repr(plain).removeprefix("Plain")
    assert Fast(1, c=(2,)) == Fast(1, "b", (2,))
    assert hash(Fast(1)) == hash(Fast(1))
    assert dataclasses.replace(Fast(1), b="z") == Fast(1, "z")
    assert pickle.loads(pickle.dumps(Fast(1, "x", (3,)))) == Fast(1, "x", (3,))


def test_wrong_arguments_are_refused_as_before() -> None:
    with pytest.raises(TypeError):
        Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fast(1, d=2)  # type: ignore[call-arg]


def test_still_frozen() -> None:
    for value in (Fast(1), Step([1], "a"), TextDelta("a")):
        name = dataclasses.fields(value)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, 2)


def test_only_plain_frozen_slotted_dataclasses() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    for cls in (NoSlots, Mutable, Factory):
        with pytest.raises(TypeError):
            fast_init(cls)


def test_step_keeps_its_fields() -> None:
    step = Step([1, 2], "ab", 3, received_tokens=4)
    assert (step.token_ids, step.text, step.cached_tokens, step.finish_reason, step.usage) == (
        [1, 2],
        "ab",
        3,
        None,
        None,
    )
    assert (step.logprobs, step.kv_transfer, step.received_tokens) == (None, None, 4)
