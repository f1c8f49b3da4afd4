"""The TensorRT-LLM engine on a real GPU: prefix reuse, abort, and KV events in our hash space.

Needs an NVIDIA GPU, `tensorrt-llm`, and a small Hugging Face model directory in
AGENTSERVE_TRTLLM_MODEL (e.g. Qwen/Qwen3-0.6B); skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil

import pytest

from agentserve.config import WorkerConfig
from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import BlockStored, GenerateRequest, KvEvent, SamplingParams

MODEL = os.environ.get("AGENTSERVE_TRTLLM_MODEL")
HAVE_GPU = shutil.which("nvidia-smi") is not None and importlib.util.find_spec("tensorrt_llm") is not None

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU and tensorrt-llm"),
    pytest.mark.skipif(MODEL is None, reason="needs a model directory in AGENTSERVE_TRTLLM_MODEL"),
]


async def _scenario() -> None:
    from agentserve.worker.engines.trtllm import TrtLlmEngine

    engine = TrtLlmEngine(
        WorkerConfig(engine="trtllm", model_path=MODEL, block_size=32, free_gpu_memory_fraction=0.3)
    )
    events: list[KvEvent] = []
    sub = engine.kv_events()

    async def drain() -> None:
        async for batch in sub:
            events.extend(batch)

    await engine.start()
    drainer = asyncio.create_task(drain())
    try:
        prompt = list(range(1000, 1000 + 32 * 4 + 5))
        first = [s async for s in engine.generate(GenerateRequest("a", prompt, SamplingParams(max_tokens=8)))]
        assert first[-1].finish_reason in ("stop", "length")
        second = [
            s async for s in engine.generate(GenerateRequest("b", prompt, SamplingParams(max_tokens=8)))
        ]
        assert second[0].cached_tokens is not None and second[0].cached_tokens >= 4 * 32
        # Abort mid-stream.
        stream = engine.generate(
            GenerateRequest("c", prompt[:40], SamplingParams(max_tokens=4000, ignore_eos=True))
        )
        await stream.__anext__()
        await stream.aclose()
        await asyncio.sleep(1.0)
        stored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
        assert set(block_hashes(prompt, 32)) <= set(stored)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    finally:
        await engine.stop()
        drainer.cancel()


def test_trtllm_engine_end_to_end() -> None:
    asyncio.run(_scenario())
