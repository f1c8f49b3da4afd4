"""The samplers: the decoding settings a client sets and every engine takes as they are, defined once.

`Samplers` is the base of both the API-neutral request options (`api.options.GenerationOptions`:
what the client asked) and the engine request's settings (`worker.engine.SamplingParams`: what the
engine is told). The worker wire (encode, decode, allowed keys), TensorRT-LLM's `SamplingParams`
kwargs and the frontend's options → sampling copy read `SAMPLERS` instead of listing names, so a new
sampler is its field here, its decoder line, its contract row and its OpenAPI schema entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

NUMBER = (int, float)  # a float sampler accepts integers on the wire too


def sampler(kind: type[int] | tuple[type[int], type[float]]) -> Any:
    """A sampler every engine takes as it is, under its own name (`kind`: what the wire accepts).
    None: the engine's default."""
    return field(default=None, metadata={"sampler": kind})


@dataclass(frozen=True, slots=True, kw_only=True)
class Samplers:
    temperature: float | None = sampler(NUMBER)
    top_p: float | None = sampler(NUMBER)
    top_k: int | None = sampler(int)
    min_p: float | None = sampler(NUMBER)
    seed: int | None = sampler(int)
    presence_penalty: float | None = sampler(NUMBER)
    frequency_penalty: float | None = sampler(NUMBER)
    repetition_penalty: float | None = sampler(NUMBER)


# Each sampler's name with the types the wire accepts.
SAMPLERS: tuple[tuple[str, Any], ...] = tuple((f.name, f.metadata["sampler"]) for f in fields(Samplers))
