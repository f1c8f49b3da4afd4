"""`agentserve profile` against a real `agentserve worker` process: the round trip recovers the sim's
own coefficients, and `--sim-profile` picks what the sim runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli_worker import ROOT, free_port, worker

from agentserve.worker.profiles import load_profile

H200 = "h200-qwen3-30b-a3b-pytorch"
# The round trip's tolerance on the coefficients a short sweep pins down and on the iterations it
# measured (a sim at its real speed on a loaded 2-core machine, where a request's overhead lands in
# the short prefills; measured: within 2 % on a quiet one).
TOLERANCE = 0.15


def profile(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentserve", "profile", *args],
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def wait_ready(port: int) -> None:
    import urllib.request

    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("the worker never became ready")


@pytest.mark.serial  # a sim at its real speed, timed by the wall clock: alone, not beside other tests
def test_profiling_a_sim_worker_recovers_its_own_profile(tmp_path: Path) -> None:
    port = free_port()
    proc = worker(
        "--engine", "sim", "--port", str(port), "--kv-events-port", str(free_port()),
        "--sim-profile", H200, "--sim-speedup", "1",
    )  # fmt: skip
    try:
        wait_ready(port)
        out = tmp_path / "measured.yaml"
        png = tmp_path / "measured.png"
        t0 = time.monotonic()
        done = profile("--worker", f"http://127.0.0.1:{port}", "--quick", "-o", str(out), "--plot", str(png))
        print(f"profiled in {time.monotonic() - t0:.1f} s\n{done.stderr}")
        assert done.returncode == 0, done.stderr
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    measured = load_profile(str(out))
    truth = load_profile(H200).timing
    assert measured.obtained["method"] == "measured"
    assert measured.engine["simulating"] == H200
    labels = [m.label.split(" ")[0] for m in measured.measurements]
    assert {"prefill", "cached", "decode", "mixed"} <= set(labels)
    for name in ("base_s", "moe_expert_s", "kv_read_per_token_s", "prefill_per_token_s",
                 "prefill_attn_per_token_ctx_s", "prefill_floor_s"):  # fmt: skip
        assert getattr(measured.timing, name) == pytest.approx(getattr(truth, name), rel=TOLERANCE), name
    # The fitted model predicts the sim's true iteration times of everything measured.
    for m in measured.measurements:
        assert m.predicted(measured.timing) == pytest.approx(m.predicted(truth), rel=TOLERANCE), m.label
    # The table of measured vs modelled is printed; the plot is written where matplotlib exists.
    assert "worst |error|" in done.stderr
    assert png.exists() or "matplotlib is not installed" in done.stderr


def test_refit_and_show_work_on_a_shipped_profile(tmp_path: Path) -> None:
    shown = profile("--show", H200)
    assert shown.returncode == 0 and "decode B=64 C=8192" in shown.stdout
    out = tmp_path / "refit.yaml"
    refit = profile("--refit", H200, "--name", "mine", "-o", str(out))
    assert refit.returncode == 0, refit.stderr
    mine = load_profile(str(out))
    assert mine.name == "mine"
    assert mine.timing.base_s == pytest.approx(load_profile(H200).timing.base_s, rel=0.01)


def test_an_unprofilable_worker_or_a_bad_profile_is_a_clear_error() -> None:
    port = free_port()
    proc = worker(
        "--engine", "sim", "--port", str(port), "--kv-events-port", str(free_port()), "--sim-speedup", "0"
    )
    try:
        wait_ready(port)
        done = profile("--worker", f"http://127.0.0.1:{port}", "--quick")
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert done.returncode == 2 and "--sim-speedup" in done.stderr and "Traceback" not in done.stderr
    missing = profile("--show", "no-such-profile")
    assert missing.returncode == 2 and "b200-qwen3-30b-a3b-estimate" in missing.stderr


def test_a_worker_with_an_unknown_sim_profile_exits_with_the_shipped_names() -> None:
    proc = worker("--sim-profile", "no-such-profile", "--port", str(free_port()))
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert b"sim_profile" in out and b"h200-qwen3-30b-a3b-pytorch" in out and b"Traceback" not in out
