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


def _read_json(model_path: str | None, name: str) -> dict[str, Any] | None:
    if model_path is None:
        return None
    path = Path(model_path) / name
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s for the model's limits: %s", path, exc)
        return None
    return value if isinstance(value, dict) else None


def model_window(model_path: str | None) -> int | None:
    """The window from `model_path`'s config.json, or None (no directory, no file, no key)."""
    config = _read_json(model_path, "config.json")
    return config_window(config) if config is not None else None


def _model_dirs(config: FrontendConfig) -> list[str]:
    """Where the model's own files are: `model_path`, else a `tokenizer` directory (a frontend given
    only the model's tokenizer files)."""
    dirs = [config.model_path] if config.model_path is not None else []
    if config.tokenizer is not None and Path(config.tokenizer).is_dir():
        dirs.append(config.tokenizer)
    return dirs


def context_window(config: FrontendConfig) -> int:
    """What every catalog advertises and the budget enforces: the model's own window, or
    `context_length` where that is lower (or the model declares none). Clients size their context
    and auto-compaction from it (Codex compacts at 90%), so it must never exceed the model's."""
    declared = next((w for d in _model_dirs(config) if (w := model_window(d)) is not None), None)
    limits = [w for w in (declared, config.context_length) if w is not None]
    return min(limits) if limits else DEFAULT_CONTEXT_WINDOW


# `max_length` 20 is transformers' own default, written into old exports' generation_config.json:
# not a statement about the model.
_TRANSFORMERS_DEFAULT_MAX_LENGTH = 20


def _positive(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None


def generation_output_limit(generation: dict[str, Any]) -> int | None:
    """The output limit a `generation_config.json` states: `max_new_tokens` (tokens generated), else
    `max_length` (prompt + output, so it bounds the output too)."""
    limit = _positive(generation.get("max_new_tokens"))
    if limit is not None:
        return limit
    total = _positive(generation.get("max_length"))
    return None if total == _TRANSFORMERS_DEFAULT_MAX_LENGTH else total


def config_output_limit(config: dict[str, Any]) -> int | None:
    """An output limit in `config.json` (its text model's for multimodal configs): `max_new_tokens`
    or `max_output_tokens`. Most models state none there."""
    for key in ("text_config", "llm_config", "language_config"):
        inner = config.get(key)
        if isinstance(inner, dict) and (limit := config_output_limit(inner)) is not None:
            return limit
    return _positive(config.get("max_new_tokens")) or _positive(config.get("max_output_tokens"))


def max_output_tokens(config: FrontendConfig, window: int) -> int | None:
    """The output limit the catalogs advertise and the budget enforces: what the model's own files
    state (generation_config.json, then config.json), never more than the window; None when they
    state none (no spec or config field sets one: the catalogs omit it, docs/api-contract.md)."""
    for directory in _model_dirs(config):
        generation = _read_json(directory, "generation_config.json")
        limit = generation_output_limit(generation) if generation is not None else None
        if limit is None:
            model_config = _read_json(directory, "config.json")
            limit = config_output_limit(model_config) if model_config is not None else None
        if limit is not None:
            return min(limit, window)
    return None


_REASONING_LEVELS = ("low", "medium", "high")


def family_reasons(family: Family) -> bool:
    """The family writes reasoning before answering (a think block, or harmony's analysis channel)."""
    return family_markup(family).can_inject or family.output_style == "harmony"


def served_models(config: FrontendConfig, family: Family) -> list[ModelFacts]:
    reasons = family_reasons(family)
    window = context_window(config)
    return [
        ModelFacts(
            id=config.model,
            display_name=f"{config.model} ({family.name}, agentserve)",
            description=family.description,
            context_window=window,
            max_output_tokens=max_output_tokens(config, window),
            reasoning=reasons,
            reasoning_levels=_REASONING_LEVELS if reasons else (),
            default_reasoning_level="medium" if reasons else None,
            aliases=tuple(a for a in config.model_aliases if a != config.model),
        )
    ]
