"""Disaggregated prefill on the worker side: the wire fields, and blocks landing in a decode pool."""

from __future__ import annotations

import pytest

from agentserve.prompt.hashing import block_hashes
from agentserve.worker.engine import BlockStored, GenerateRequest, KvTransfer, SamplingParams, Step
from agentserve.worker.kvpool import KvPool
from agentserve.worker.scheduler import Scheduler, SchedulerConfig, SimSequence
from agentserve.worker.wire import (
    WireError,
    decode_request,
    encode_request,
    frame_to_step,
    step_to_frame,
)

BS = 4


def test_context_only_and_kv_transfer_round_trip_on_the_wire() -> None:
    ctx = GenerateRequest("a", [1, 2, 3], SamplingParams(max_tokens=1), context_only=True)
    back = decode_request(encode_request(ctx))
    assert back.context_only and back.kv_transfer is None and list(back.prompt_token_ids) == [1, 2, 3]
    transfer = KvTransfer("a", 96, "http://10.0.0.5:8200", 0.25)
    gen = GenerateRequest("b", [1, 2, 3], SamplingParams(max_tokens=8), kv_transfer=transfer)
    back = decode_request(encode_request(gen))
    assert back.kv_transfer == transfer and not back.context_only
    last = Step([7], "x", None, "length", None, kv_transfer=KvTransfer("a", 96))
    assert frame_to_step(step_to_frame(last)).kv_transfer == KvTransfer("a", 96)
    first = Step([7], "x", 0, received_tokens=96)
    assert frame_to_step(step_to_frame(first)).received_tokens == 96


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"context_only": "yes"}, "context_only must be a boolean"),
        ({"kv_transfer": {"handle": "", "tokens": 1}}, "handle"),
        ({"kv_transfer": {"handle": "h", "tokens": -1}}, "tokens"),
        ({"kv_transfer": {"handle": "h", "tokens": 1, "seconds": 1e9}}, "seconds"),
        ({"kv_transfer": {"handle": "h", "tokens": 1, "extra": 1}}, "kv_transfer must be an object"),
        ({"context_only": True, "kv_transfer": {"handle": "h", "tokens": 1}}, "not both"),
    ],
)
def test_bad_disaggregation_fields_are_wire_errors(change: dict[str, object], message: str) -> None:
    body = {"token_ids": [1, 2], "sampling": {"max_tokens": 2}, **change}
    with pytest.raises(WireError, match=message):
        decode_request(body)


def scheduler() -> Scheduler:
    return Scheduler(KvPool(64, BS), SchedulerConfig(max_num_tokens=64))


def test_received_blocks_land_as_computed_and_are_announced() -> None:
    s = scheduler()
    prompt = list(range(1, 19))  # 4 full blocks + 2 tokens
    hashes = block_hashes(prompt, BS)
    # The decode pool already holds the first block (a shared prefix); the transfer brings 16 tokens.
    s.pool.allocate(1)
    s.pool.commit(hashes[:1], None)
    s.pool.release(hashes[:1])
    s.pool.take_events()
    seq = SimSequence("r", list(prompt), len(prompt), [99, 98], "stop")
    seq.received_tokens = 16
    s.add(seq)
    out = s.step()
    # Only the 2 tokens past the transferred blocks were prefilled.
    assert out.work.prefill == [(16, 2)]
    assert seq.cached_tokens == 4 and seq.received == 12
    assert s.received_prompt_tokens == 12
    stored = [e for e in out.events if isinstance(e, BlockStored)]
    assert stored and stored[0].block_hashes == tuple(hashes[1:4]) and stored[0].parent_hash == hashes[0]
    assert s.pool.match(hashes) == 4


def test_a_whole_prompt_received_still_computes_one_token() -> None:
    s = scheduler()
    prompt = list(range(1, 17))  # exactly 4 blocks
    seq = SimSequence("r", list(prompt), len(prompt), [99], "stop")
    seq.received_tokens = 16
    s.add(seq)
    out = s.step()
    assert out.work.prefill == [(15, 1)]  # the logits of the last token
    assert seq.cached_tokens == 0 and seq.received == 15
    assert [t for q in out.emitted for t in q.output] == [99]
