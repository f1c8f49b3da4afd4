"""`--processes` settings: what N > 1 refuses, what each child changes."""

from __future__ import annotations

import pytest

from agentserve.config import ConfigError, FrontendConfig, UpConfig
from agentserve.frontend import processes


def config(**kw: object) -> FrontendConfig:
    return FrontendConfig.model_validate({"model": "qwen3-sim", "worker_urls": ["http://w:1"], **kw})


def test_one_process_needs_nothing_more() -> None:
    processes.check(config())


def test_more_processes_need_a_shared_state_store() -> None:
    with pytest.raises(ConfigError, match="shared state store"):
        processes.check(config(processes=2))
    processes.check(config(processes=2, state_url="redis://r:6379/0"))
    processes.check(config(processes=2, state_url_file="/etc/state/url"))


def test_tool_events_cannot_be_split_over_processes() -> None:
    with pytest.raises(ConfigError, match="tool_events_zmq"):
        processes.check(config(processes=2, state_url="redis://r/0", tool_events_zmq="tcp://127.0.0.1:1"))


def test_each_child_writes_its_own_trace_file() -> None:
    assert processes.child_config(config(), 1).trace_sink is None
    c = processes.child_config(config(trace_sink="/var/trace/t.jsonl"), 3)
    assert c.trace_sink == "/var/trace/t.jsonl.p3"


def test_the_child_index_comes_from_the_environment() -> None:
    assert processes.child_index({}) is None
    assert processes.child_index({processes.PROCESS_ENV: "2"}) == 2


def test_agentserve_up_is_one_process() -> None:
    with pytest.raises(ValueError, match="less than or equal to 1"):
        UpConfig.model_validate({"processes": 2})
