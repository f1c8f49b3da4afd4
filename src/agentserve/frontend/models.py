"""The models this frontend serves, described once for the three catalogs (`api.catalog`)."""

from __future__ import annotations

from agentserve.api.catalog import ModelFacts
from agentserve.config import FrontendConfig
from agentserve.families import Family
from agentserve.prompt.markup import family_markup

DEFAULT_CONTEXT_WINDOW = 131072
_REASONING_LEVELS = ("low", "medium", "high")


def family_reasons(family: Family) -> bool:
    """The family writes reasoning before answering (a think block, or harmony's analysis channel)."""
    return family_markup(family).can_inject or family.name == "gpt-oss"


def served_models(config: FrontendConfig, family: Family) -> list[ModelFacts]:
    reasons = family_reasons(family)
    return [
        ModelFacts(
            id=config.model,
            display_name=f"{config.model} ({family.name}, agentserve)",
            description=family.description,
            context_window=config.context_length or DEFAULT_CONTEXT_WINDOW,
            reasoning=reasons,
            reasoning_levels=_REASONING_LEVELS if reasons else (),
            default_reasoning_level="medium" if reasons else None,
            aliases=tuple(a for a in config.model_aliases if a != config.model),
        )
    ]
