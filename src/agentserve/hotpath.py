"""Frozen slotted dataclasses created per token: a cheaper `__init__`, same signature, same object.

A frozen dataclass's generated `__init__` stores each field with `object.__setattr__(self, name,
value)` (its own `__setattr__` refuses assignments), about twice the cost of storing through the
field's slot descriptor, and it stores every field, defaults included. On values created per token
(engine steps, output deltas) each field is paid per token, so a rarely used field added to one of
them slows every stream down. `fast_init` replaces that `__init__` with one that stores through the
slots' descriptors (`member.__set__`): the parameters, defaults, order and resulting instance are the
dataclass's own, and the class stays frozen (assigning a field still raises `FrozenInstanceError`).
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, TypeVar

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen, slotted dataclass `cls` (plain fields with plain defaults, no `__post_init__`)
    an `__init__` that sets its slots through their descriptors. Apply it above `@dataclass`."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen dataclass with slots")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__")
    names: list[str] = []
    signature: list[str] = []
    closure: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init or f.kw_only or f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: only positional fields with plain defaults")
        names.append(f.name)
        closure[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is MISSING:
            signature.append(f.name)
        else:
            closure[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
    body = "\n".join(f"        _set_{name}(self, {name})" for name in names) or "        pass"
    source = (
        f"def __make__({', '.join(closure)}):\n"
        f"    def __init__(self, {', '.join(signature)}):\n{body}\n"
        "    return __init__\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, {}, namespace)  # the source names only the dataclass's own fields
    init = namespace["__make__"](**closure)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = {**{f.name: f.type for f in fields(cls)}, "return": None}  # type: ignore[arg-type]
    type.__setattr__(cls, "__init__", init)
    return cls
