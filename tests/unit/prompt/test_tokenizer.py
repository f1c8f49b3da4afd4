"""Tokens: the embedded default tokenizer, model-directory tokenizers, reasoning-start detection."""

from __future__ import annotations

import importlib.util
import json
import shutil
from importlib import resources
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prompt_cases import CASES, FAMILY_NAMES, conversation, family, follow_up
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from agentserve.conversation import Message, Text
from agentserve.prompt.pipeline import PromptPipeline, render_prompt
from agentserve.prompt.template import TemplateLoadError
from agentserve.prompt.tokenizer import Tokenizer, embedded_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def build_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_tokenizer", ROOT / "scripts" / "build_tokenizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def embedded_path() -> Path:
    return Path(str(resources.files("agentserve.data").joinpath("tokenizer.json")))


def test_the_embedded_tokenizer_is_small_and_loads_without_a_download() -> None:
    assert embedded_path().stat().st_size < 1024 * 1024
    assert embedded_tokenizer().vocab_size > 1000


def test_every_family_marker_is_a_single_token() -> None:
    tokenizer = embedded_tokenizer()
    for marker in build_script().special_tokens():
        ids = tokenizer.encode(f"x{marker}y")
        assert tokenizer.token_id(marker) in ids and len(ids) == 3, marker


@pytest.mark.parametrize("text", ["plain words", "ünïcødé 🚀 \t\n mixed", '{"a": [1, 2.5e3]}', ""])
def test_encoding_round_trips_any_text(text: str) -> None:
    tokenizer = embedded_tokenizer()
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.count(text) == len(tokenizer.encode(text))


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",))))
def test_characters_outside_the_vocabulary_fall_back_to_bytes_and_decode_exactly(text: str) -> None:
    tokenizer = embedded_tokenizer()
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert tokenizer.token_id("<unk>") is None  # nothing is ever unknown


def test_the_committed_tokenizer_is_what_the_build_script_describes() -> None:
    # Catches an edit to the script's split or byte tokens without a rebuild (the vocabulary itself
    # depends on the repository's text, so it is not compared).
    script = build_script()
    data = json.loads(embedded_path().read_text(encoding="utf-8"))
    assert data["pre_tokenizer"]["pattern"] == {"Regex": script.SPLIT}
    assert data["model"]["byte_fallback"] is True
    tokenizer = embedded_tokenizer()
    ids = [tokenizer.token_id(t) for t in script.BYTE_TOKENS]
    assert None not in ids and len(set(ids)) == 256


def test_a_trailing_newline_run_tokenizes_as_it_does_before_more_text() -> None:
    # Prompts end in "\n\n" (Llama 3 headers) and the model writes after it: the next prompt holds
    # that same text followed by more, and must start with the same tokens.
    tokenizer = embedded_tokenizer()
    head = tokenizer.encode("<|end_header_id|>\n\n")
    assert tokenizer.encode('<|end_header_id|>\n\n{"name": 1}')[: len(head)] == head


def test_a_model_directory_tokenizer_is_used_and_a_missing_one_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TemplateLoadError, match=r"no tokenizer\.json"):
        Tokenizer.from_model_dir(tmp_path)
    shutil.copy(embedded_path(), tmp_path / "tokenizer.json")
    loaded = Tokenizer.from_model_dir(tmp_path)
    assert loaded.encode("<think>hi") == embedded_tokenizer().encode("<think>hi")
    (tmp_path / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(TemplateLoadError, match="cannot load tokenizer"):
        Tokenizer.from_model_dir(tmp_path)


@pytest.mark.parametrize(
    ("name", "kwargs", "starts"),
    [
        ("deepseek-r1", {}, True),
        ("minimax-m2", {}, True),
        ("deepseek-v3.1", {"enable_thinking": True}, True),
        ("deepseek-v3.1", {}, False),
        ("qwen3-coder", {"enable_thinking": True}, True),
        ("qwen3", {}, False),
        ("qwen3", {"enable_thinking": False}, False),
        ("glm-4.5", {"enable_thinking": False}, False),
        ("gpt-oss", {}, False),
        ("llama3-json", {}, False),
    ],
)
def test_detects_a_prompt_that_ends_inside_an_open_reasoning_block(
    name: str, kwargs: dict[str, bool], starts: bool
) -> None:
    rendered = render_prompt(conversation(), PromptPipeline.for_family(family(name)), **kwargs)
    assert rendered.starts_in_reasoning is starts


def test_a_prompt_without_a_generation_prompt_never_starts_in_reasoning() -> None:
    pipeline = PromptPipeline.for_family(family("deepseek-r1"))
    assert not render_prompt(conversation(), pipeline, add_generation_prompt=False).starts_in_reasoning


MARKED_TEXT = st.lists(
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(
            ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<s>", "<sop>", "]~b]", "\n\n"]
        ),
    ),
    max_size=12,
).map("".join)


@given(MARKED_TEXT)
def test_encoding_piece_by_piece_equals_encoding_whole(text: str) -> None:
    tokenizer = embedded_tokenizer()
    plain = tokenizer._tok.encode(text, add_special_tokens=False).ids
    assert tokenizer.encode(text) == tokenizer.encode(text) == tokenizer._encode(text) == plain


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_prompt_ids_equal_a_plain_encode_of_the_whole_prompt_cold_and_warm(name: str) -> None:
    # Pieces come from the cache shared by every session: a new conversation with the same system
    # prompt and tools, and the next turn of this one, must still get exactly the plain ids.
    tokenizer = Tokenizer.from_file(embedded_path())
    pipeline = PromptPipeline.for_family(family(name), tokenizer=tokenizer)
    script = CASES[name]
    history: list[Message] = []
    for turn, case in enumerate(script):
        history += [Message("assistant", case.numbered(turn * 2, name == "kimi-k2").parts), follow_up(case)]
    other = conversation(Message("user", (Text("A different question, another session."),)))
    for request in (conversation(*history[:2]), other, conversation(*history)):
        rendered = render_prompt(request, pipeline)
        plain = tokenizer._tok.encode(rendered.text, add_special_tokens=False).ids
        assert list(rendered.token_ids) == plain


def test_the_piece_cache_is_bounded_and_exact_for_a_growing_prompt(tmp_path: Path) -> None:
    shutil.copy(embedded_path(), tmp_path / "tokenizer.json")
    tokenizer = Tokenizer.from_file(tmp_path / "tokenizer.json")
    small = Tokenizer(HFTokenizer.from_file(str(tmp_path / "tokenizer.json")), "small", cache_chars=64)
    prompt = ""
    for turn in range(20):
        prompt += f"<|im_start|>user\nturn {turn}: " + "words " * turn + "<|im_end|>\n"
        assert tokenizer.encode(prompt) == small.encode(prompt) == tokenizer._encode(prompt)
        assert small._cached <= 64


def test_a_tokenizer_whose_markers_strip_spaces_is_encoded_whole() -> None:
    hf = HFTokenizer.from_str(embedded_path().read_text(encoding="utf-8"))
    hf.add_tokens([AddedToken("<mask>", lstrip=True)])
    tokenizer = Tokenizer(hf, "lstrip")
    assert tokenizer._split is None
    assert tokenizer.encode("a <mask> b") == hf.encode("a <mask> b", add_special_tokens=False).ids
