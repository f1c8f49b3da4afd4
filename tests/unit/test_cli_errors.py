"""CLI mistakes are answered naming the flag and the form it takes; the defaults agree."""

from __future__ import annotations

import pytest

from agentserve.cli import main
from agentserve.config import ConfigError, FrontendConfig, RouterConfig, WorkerConfig, load_config
from agentserve.families import family_for_model


@pytest.mark.parametrize(
    ("argv", "flag", "hint"),
    [
        (["router", "--workers", "a,b"], "--workers", "http://host:port"),
        (["router", "--workers", "http://h:abc"], "--workers", "http://host:port"),
        (["router", "--workers", "h:8200"], "--workers", "http://host:port"),
        (["frontend", "--worker-urls", "h:1"], "--worker-urls", "http://host:port"),
        (["frontend", "--router-url", "router"], "--router-url", "http://host[:port]"),
        (["frontend", "--block-size", "0", "--worker-urls", "http://a:1"], "--block-size", "greater than"),
    ],
)
def test_a_bad_flag_is_named_with_the_form_it_takes(
    argv: list[str], flag: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert flag in err and hint in err, err
    assert "Port could not be cast" not in err and "validation error" not in err


def test_comma_separated_worker_urls_are_a_list() -> None:
    config = load_config(RouterConfig, overrides={"workers": ["http://a:1,http://b:2/", "http://c:3"]})
    assert config.workers == ["http://a:1", "http://b:2", "http://c:3"]


def test_an_unknown_setting_in_a_config_file_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'modle'"):
        load_config(FrontendConfig, overrides={"modle": "x"})


def test_frontend_and_worker_agree_on_the_default_model_and_its_family() -> None:
    assert FrontendConfig().model == WorkerConfig().model == "qwen3-sim"
    assert family_for_model(FrontendConfig().model) is not None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["up", "--family", "nope"], "--family: unknown model family 'nope'; known families: "),
        (["up", "--model", "foo"], "from --model 'foo': set --family (one of "),
        (["up", "--tokenizer", "/nonexistent/tokenizer.json"], "--tokenizer /nonexistent/tokenizer.json: "),
    ],
)
def test_model_flags_are_named_with_the_choices(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) != 0
    assert expected in capsys.readouterr().err
