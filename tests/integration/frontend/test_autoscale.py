"""`agentserve up --autoscale MIN:MAX`: the planner adds sim workers under a burst and removes them
after it, through the real frontend, router and engines (the sim's clock at speed-up 50)."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from stack import Served, served

from agentserve.config import ConfigError, UpConfig, add_config_flags, config_from_args
from agentserve.frontend.up import build_up

SPEEDUP = 50.0
LONG_ANSWER = " ".join(f"word{i % 50}" for i in range(300))


def settings(tmp_path: Path) -> dict[str, object]:
    script = tmp_path / "long.yaml"
    script.write_text(f'default: "{LONG_ANSWER}"\n')
    return {
        "autoscale": "1:3",
        "sim_speedup": SPEEDUP,
        "sim_profile": "h200-qwen3-30b-a3b-pytorch",
        "script": str(script),
        # Every planner duration is on the sim's clock: 10 s = 0.2 s of wall time here.
        "planner_interval_s": 10.0,
        "scale_down_delay_s": 60.0,
        "sim_model_load_s": 20.0,
        # One worker decoding ~20 streams at once is far above a 30 ms ITL on this profile.
        "itl_target_ms": 30.0,
        "ttft_target_ms": 20_000.0,
    }


def wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def engines(stack: Served) -> int:
    return len(stack.backend.engines)


def test_a_burst_scales_the_sim_workers_up_and_its_end_scales_them_down(tmp_path: Path) -> None:
    with served(settings(tmp_path)) as stack:
        assert engines(stack) == 1
        client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="test", max_retries=0)
        stop = threading.Event()
        errors: list[BaseException] = []

        def user(i: int) -> None:
            while not stop.is_set():
                try:
                    reply = client.chat.completions.create(
                        model="qwen3-sim", messages=[{"role": "user", "content": f"task {i}"}], max_tokens=400
                    )
                    assert reply.choices[0].message.content
                except BaseException as exc:
                    errors.append(exc)
                    return

        users = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(20)]
        for t in users:
            t.start()
        try:
            scaled_up = wait_for(lambda: engines(stack) == 3, timeout=30)
            metrics = httpx.get(f"{stack.url}/metrics").text
        finally:
            stop.set()
            for t in users:
                t.join(30)
        assert not errors, errors[:3]
        assert scaled_up, [d.reason for d in stack.app.state.planner.decisions[-5:]]
        assert "agentserve_planner_desired_workers 3.0" in metrics
        # After the burst: back to the minimum once the scale-down delay has passed, every request served.
        assert wait_for(lambda: engines(stack) == 1, timeout=30), [
            d.reason for d in stack.app.state.planner.decisions[-5:]
        ]
        reasons = {d.reason.split(":")[0] for d in stack.app.state.planner.decisions}
        assert {"targets", "hold"} <= reasons or {"max", "hold"} <= reasons, reasons
        assert any(r.startswith("down") for r in (d.reason for d in stack.app.state.planner.decisions))


def test_autoscale_needs_a_sim_that_keeps_time_and_a_valid_range(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sim-speedup"):
        build_up(UpConfig.model_validate({**settings(tmp_path), "sim_speedup": 0}))
    with pytest.raises(ValueError, match="add --autoscale"):
        UpConfig.model_validate({"ttft_target_ms": 500})
    parser = argparse.ArgumentParser()
    add_config_flags(parser, UpConfig)
    with pytest.raises(ConfigError, match=r"^--itl-target-ms set the planner: add --autoscale MIN:MAX$"):
        config_from_args(UpConfig, parser.parse_args(["--itl-target-ms", "50"]))
    for bad in ("3:1", "0:2", "two:four", "1-3"):
        with pytest.raises(ValueError, match=r"MIN:MAX|MIN <= MAX"):
            UpConfig.model_validate({"autoscale": bad})
