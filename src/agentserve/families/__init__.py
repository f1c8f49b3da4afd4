"""The model families and their registry.

Each module under `agentserve.families` owns one family (see `base.Family`). Look a family up by
its name or an alias with `get_family`, or infer it from a model name with `family_for_model`.
"""

from __future__ import annotations

from importlib import import_module

from agentserve.families.base import Family

# Most specific first: `family_for_model` returns the first family whose pattern matches.
_MODULES = (
    "gpt_oss",
    "kimi_k2",
    "deepseek_r1",
    "deepseek_v31",
    "qwen3_coder",
    "qwen3",
    "glm45",
    "minimax_m2",
    "nemotron",
    "mistral",
    "llama3_json",
    "pythonic",
)


def _load() -> tuple[Family, ...]:
    return tuple(import_module(f"agentserve.families.{m}").FAMILY for m in _MODULES)


FAMILIES: tuple[Family, ...] = _load()
_BY_NAME: dict[str, Family] = {}
for _family in FAMILIES:
    for _key in (_family.name, *_family.aliases):
        _BY_NAME.setdefault(_key.lower().replace("_", "-"), _family)


def family_names() -> tuple[str, ...]:
    """Every name `get_family` accepts, spelled as users write them (`qwen3-coder` and `qwen3_coder`):
    the CRD's enum of `model.family` and of the parser fields is generated from this."""
    names = {spelling for key in _BY_NAME for spelling in (key, key.replace("-", "_"))}
    return tuple(sorted(names))


class UnknownFamilyError(LookupError):
    pass


def get_family(name: str) -> Family:
    """A family by its name or alias (`qwen3-coder`, `qwen3_coder`, `hermes`, …)."""
    family = _BY_NAME.get(name.lower().replace("_", "-"))
    if family is None:
        known = ", ".join(sorted(f.name for f in FAMILIES))
        raise UnknownFamilyError(f"unknown model family {name!r}; known families: {known}")
    return family


def family_for_model(model: str) -> Family | None:
    """Infer the family from a model name such as `Qwen/Qwen3-Coder-30B-A3B-Instruct`."""
    for family in FAMILIES:
        if family.matches_model(model):
            return family
    return None


__all__ = ["FAMILIES", "Family", "UnknownFamilyError", "family_for_model", "family_names", "get_family"]
