"""TensorRT-LLM's disaggregated path: DisaggregatedParams ↔ KvTransfer (pure), the LLM arguments of
prefill and decode workers, and the engine's context-only / generation-only requests against the
stand-in `tensorrt_llm` module (test_trtllm_engine_stand_in.py)."""

from __future__ import annotations

import base64
import json
import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from test_trtllm_engine_stand_in import BS, FakeLLM, Result, stand_in  # noqa: F401 (the fixture)

from agentserve.config import ConfigError, WorkerConfig
from agentserve.worker.engine import GenerateRequest, InvalidRequestError, KvTransfer, SamplingParams
from agentserve.worker.engines.trtllm_disagg import (
    context_only_params,
    generation_only_params,
    handle_of,
    transceiver_kwargs,
)
from agentserve.worker.engines.trtllm_mapping import llm_kwargs

pytestmark = pytest.mark.anyio

# A context response's disaggregated_params as TensorRT-LLM fills them (fields of
# tensorrt_llm/disaggregated_params.py; the opaque state is the cache transceiver's bytes).
RECORDED = SimpleNamespace(
    request_type="context_only",
    first_gen_tokens=[151_667],
    ctx_request_id=2049,
    opaque_state=bytes(range(256)) * 3,
    draft_tokens=None,
    disagg_request_id=None,
    ctx_dp_rank=0,
    ctx_info_endpoint="tcp://10.0.3.17:39411",
    schedule_style=None,
)


def test_the_context_response_travels_as_a_handle_and_comes_back_as_generation_params() -> None:
    handle = handle_of(RECORDED)
    assert handle.startswith("trtllm:") and len(handle) < 16384
    assert generation_only_params(handle) == {
        "request_type": "generation_only",
        "first_gen_tokens": [151_667],
        "ctx_request_id": 2049,
        "opaque_state": RECORDED.opaque_state,
        "ctx_dp_rank": 0,
        "ctx_info_endpoint": "tcp://10.0.3.17:39411",
    }
    assert context_only_params() == {"request_type": "context_only"}


def _handle(data: object) -> str:
    return "trtllm:" + base64.urlsafe_b64encode(json.dumps(data).encode()).decode()


@pytest.mark.parametrize(
    "handle",
    [
        "c1",  # a sim worker's handle
        "trtllm:@@@",
        _handle(["not", "an", "object"]),
        _handle({"ctx_request_id": 1, "evil": True}),
        _handle({"ctx_request_id": 1, "opaque_state": "***"}),
    ],
)
def test_a_handle_that_is_not_one_is_an_invalid_request(handle: str) -> None:
    with pytest.raises(InvalidRequestError):
        generation_only_params(handle)


def test_a_context_response_without_params_or_ids_has_no_handle() -> None:
    with pytest.raises(InvalidRequestError):
        handle_of(None)
    with pytest.raises(InvalidRequestError, match="names no request"):
        handle_of(SimpleNamespace(first_gen_tokens=[1]))


def test_prefill_and_decode_workers_get_the_cache_transceiver() -> None:
    assert transceiver_kwargs("both", None) == {}
    assert transceiver_kwargs("prefill", 131_072) == {
        "cache_transceiver_config": {"backend": "DEFAULT", "max_tokens_in_buffer": 131_072},
        "disable_overlap_scheduler": True,
    }
    assert "disable_overlap_scheduler" not in transceiver_kwargs("decode", 8192)
    with pytest.raises(ValueError, match="max_seq_len"):
        transceiver_kwargs("decode", None)
    base = {"engine": "trtllm", "model_path": "/m", "role": "prefill"}
    kwargs = llm_kwargs(WorkerConfig(**base, max_seq_len=65_536))  # type: ignore[arg-type]
    assert kwargs["cache_transceiver_config"]["max_tokens_in_buffer"] == 65_536
    with pytest.raises(ConfigError, match="max_seq_len"):
        llm_kwargs(WorkerConfig(**base))  # type: ignore[arg-type]
    small = {"cache_transceiver_config": {"max_tokens_in_buffer": 16_384}}
    with pytest.raises(ConfigError, match="deadlock"):
        llm_kwargs(WorkerConfig(**base, max_seq_len=65_536), small)  # type: ignore[arg-type]


class FakeDisaggregatedParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        for k, v in kwargs.items():
            setattr(self, k, v)


class FakeCacheTransceiverConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class FailedTransfer:
    """A generation-only result whose KV never came: the executor fails it before any token."""

    def __aiter__(self) -> FailedTransfer:
        return self

    async def __anext__(self) -> Any:
        raise RuntimeError("kv transfer timed out")

    def abort(self) -> None:
        pass


class DisaggLLM(FakeLLM):
    """The stand-in LLM, taking non-streaming context-only requests and answering them with params."""

    fail_transfers = False

    def generate_async(  # type: ignore[override]
        self, prompt: list[int], sampling_params: Any, streaming: bool, **extra: Any
    ) -> Result | FailedTransfer:
        params = extra.get("disaggregated_params")
        context_only = params is not None and params.request_type == "context_only"
        assert streaming is not context_only  # a context-only request is not streamed
        if params is not None and not context_only and DisaggLLM.fail_transfers:
            self.extra = extra
            return FailedTransfer()
        result = super().generate_async(prompt, sampling_params, True, **extra)
        self.streaming = streaming
        if context_only:
            result.disaggregated_params = SimpleNamespace(
                **{**vars(RECORDED), "ctx_request_id": len(self.results)}
            )  # type: ignore[attr-defined]
        return result


@pytest.fixture
def disagg_stand_in(stand_in: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:  # noqa: F811
    sys.modules["tensorrt_llm"].LLM = DisaggLLM  # type: ignore[attr-defined]
    module = types.ModuleType("tensorrt_llm.disaggregated_params")
    module.DisaggregatedParams = FakeDisaggregatedParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm.disaggregated_params", module)
    args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
    args.CacheTransceiverConfig = FakeCacheTransceiverConfig  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", args)
    yield


async def _engine(role: str) -> Any:
    from agentserve.worker.engines.trtllm import TrtLlmEngine

    config = WorkerConfig(engine="trtllm", model_path="/m", block_size=BS, role=role, max_seq_len=4096)  # type: ignore[arg-type]
    engine = TrtLlmEngine(config)
    await engine.start()
    return engine


async def test_a_prefill_worker_names_its_kv_and_a_decode_worker_asks_for_it(disagg_stand_in: None) -> None:
    prefill = await _engine("prefill")
    llm = FakeLLM.instances[-1]
    assert isinstance(llm.kwargs["cache_transceiver_config"], FakeCacheTransceiverConfig)
    assert llm.kwargs["disable_overlap_scheduler"] is True
    prompt = list(range(1, 3 * BS + 2))
    request = GenerateRequest("ctx", prompt, SamplingParams(max_tokens=1), context_only=True)
    steps = [s async for s in prefill.generate(request)]
    sent = llm.extra["disaggregated_params"]
    assert sent.kwargs == {"request_type": "context_only"} and llm.streaming is False  # type: ignore[attr-defined]
    transfer = steps[-1].kv_transfer
    assert transfer is not None and transfer.tokens == len(prompt)
    await prefill.stop()

    decode = await _engine("decode")
    llm = FakeLLM.instances[-1]
    assert "disable_overlap_scheduler" not in llm.kwargs
    shipped = KvTransfer(transfer.handle, transfer.tokens, "http://10.0.3.17:8200", 0.01)
    steps = [
        s
        async for s in decode.generate(
            GenerateRequest("gen", prompt, SamplingParams(max_tokens=3), kv_transfer=shipped)
        )
    ]
    sent = llm.extra["disaggregated_params"]
    assert sent.kwargs["request_type"] == "generation_only" and sent.kwargs["ctx_request_id"] == 1
    assert sent.kwargs["opaque_state"] == RECORDED.opaque_state
    assert steps[0].received_tokens == len(prompt) and llm.streaming is True  # type: ignore[attr-defined]
    assert "".join(s.text for s in steps) == "ABC"
    # A sim worker's handle (or none a TensorRT-LLM worker can read): prefilled here, said so.
    steps = [
        s
        async for s in decode.generate(
            GenerateRequest("sim", prompt, SamplingParams(max_tokens=1), kv_transfer=KvTransfer("c1", 16))
        )
    ]
    assert steps[0].received_tokens == 0 and "disaggregated_params" not in llm.extra
    await decode.stop()


async def test_an_aggregated_worker_serves_disaggregated_requests_whole(disagg_stand_in: None) -> None:
    engine = await _engine("both")
    llm = FakeLLM.instances[-1]
    assert "cache_transceiver_config" not in llm.kwargs
    prompt = list(range(1, 2 * BS))
    steps = [
        s
        async for s in engine.generate(
            GenerateRequest("c", prompt, SamplingParams(max_tokens=1), context_only=True)
        )
    ]
    assert steps[-1].kv_transfer is None  # the dispatcher then prefills on the decode worker
    steps = [
        s
        async for s in engine.generate(
            GenerateRequest(
                "g", prompt, SamplingParams(max_tokens=1), kv_transfer=KvTransfer(handle_of(RECORDED), 8)
            )
        )
    ]
    assert steps[0].received_tokens == 0 and "disaggregated_params" not in llm.extra
    await engine.stop()


async def test_a_transfer_that_fails_is_prefilled_on_the_decode_worker(disagg_stand_in: None) -> None:
    decode = await _engine("decode")
    llm = FakeLLM.instances[-1]
    DisaggLLM.fail_transfers = True
    try:
        prompt = list(range(1, 3 * BS + 2))
        transfer = KvTransfer(handle_of(RECORDED), 8)
        request = GenerateRequest("g", prompt, SamplingParams(max_tokens=2), kv_transfer=transfer)
        steps = [s async for s in decode.generate(request)]
    finally:
        DisaggLLM.fail_transfers = False
    assert steps[0].received_tokens == 0 and "".join(s.text for s in steps) == "AB"
    assert "disaggregated_params" not in llm.extra  # the second submission is a plain one
    assert decode.ready and decode.fatal_error is None
    await decode.stop()
