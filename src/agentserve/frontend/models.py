"""The models this frontend serves, described once for the three catalogs (`api.catalog`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from agentserve.api.catalog import ModelFacts
from agentserve.config import FrontendConfig
from agentserve.families import Family
from agentserve.prompt.markup import family_markup

log = logging.getLogger("agentserve.frontend")

DEFAULT_CONTEXT_WINDOW = 131072  # no model directory and no context_length: the sim's window
# config.json keys that hold the trained window, in the order model families use them.
_WINDOW_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
# RoPE scalings that stretch the window by `factor` (vLLM's rule); llama3 / longrope configs already
# state the stretched window in max_position_embeddings.
_STRETCHING = frozenset({"yarn", "dynamic", "linear"})


def config_window(config: dict[str, Any]) -> int | None:
    """The context window a Hugging Face `config.json` declares (its text model's, for multimodal
    configs), with a stretching RoPE scaling's factor applied; None when it declares none."""
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, dict) and config_window(inner) is not None:
            return config_window(inner)
    window = next((config[k] for k in _WINDOW_KEYS if type(config.get(k)) is int and config[k] > 0), None)
    if window is None:
        return None
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        factor = scaling.get("factor")
        if kind in _STRETCHING and isinstance(factor, int | float) and factor > 1:
            window = int(window * factor)
    return int(window)


def model_window(model_path: str | None) -> int | None:
    """The window from `model_path`'s config.json, or None (no directory, no file, no key)."""
    if model_path is None:
        return None
    path = Path(model_path) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s for the context window: %s", path, exc)
        return None
    return config_window(config) if isinstance(config, dict) else None


def context_window(config: FrontendConfig) -> int:
    """What every catalog advertises and the budget enforces: the model's own window, or
    `context_length` where that is lower (or the model declares none). Clients size their context
    and auto-compaction from it (Codex compacts at 90%), so it must never exceed the model's."""
    declared = model_window(config.model_path)
    if declared is None and config.tokenizer is not None and Path(config.tokenizer).is_dir():
        declared = model_window(config.tokenizer)  # a frontend given only the model's tokenizer files
    limits = [w for w in (declared, config.context_length) if w is not None]
    return min(limits) if limits else DEFAULT_CONTEXT_WINDOW


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
            context_window=context_window(config),
            reasoning=reasons,
            reasoning_levels=_REASONING_LEVELS if reasons else (),
            default_reasoning_level="medium" if reasons else None,
            aliases=tuple(a for a in config.model_aliases if a != config.model),
        )
    ]
