"""Every field the three decoders accept is classified in `api/contract.py` (effect / refused /
ignored), and the classification is held to the code: the published request schema's fields, the
keys the decoders read and the documented table must all agree, and every refused field is a 400
naming it."""

from __future__ import annotations

import ast
import copy
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from agentserve.api import contract, schema
from agentserve.api.anthropic.decode import decode_messages
from agentserve.api.chat.decode import decode_chat
from agentserve.api.contract import TABLES, Api
from agentserve.api.errors import ApiError
from agentserve.api.responses.decode import decode_responses
from agentserve.api.signing import Signer

ROOT = Path(__file__).resolve().parents[3]
MODELS: dict[Api, type[BaseModel]] = {
    "anthropic": schema.AnthropicMessagesRequest,
    "chat": schema.ChatCompletionRequest,
    "responses": schema.ResponsesRequest,
}
DECODERS: dict[Api, Path] = {
    "anthropic": ROOT / "src/agentserve/api/anthropic/decode.py",
    "chat": ROOT / "src/agentserve/api/chat/decode.py",
    "responses": ROOT / "src/agentserve/api/responses/decode.py",
}
SHARED = [ROOT / "src/agentserve/api/nvext.py"]


# -- the schema's field paths -------------------------------------------------------------------


def _tags(model: type[BaseModel]) -> list[str]:
    """The `[tag]`s of an array item of this model: its `type` literals, `*` for a pattern."""
    explicit = getattr(model, "contract_tag", None)
    if isinstance(explicit, str):
        return [explicit]
    field = model.model_fields.get("type")
    if field is None:
        return [""]
    out: list[str] = []

    def literals(annotation: Any) -> None:
        origin = get_origin(annotation)
        if origin is Literal:
            out.extend(str(v) for v in get_args(annotation))
        elif origin in (Union, types.UnionType):
            for arg in get_args(annotation):
                literals(arg)
        elif origin is Annotated:
            literals(get_args(annotation)[0])
        elif annotation is not type(None):
            out.append("*")

    literals(field.annotation)
    return out


def _walk(annotation: Any, path: str, out: set[str], *, item: bool = False) -> None:
    origin = get_origin(annotation)
    if origin is Annotated:
        _walk(get_args(annotation)[0], path, out, item=item)
    elif origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            _walk(arg, path, out, item=item)
    elif origin is list:
        _walk(get_args(annotation)[0], path, out, item=True)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        tags = _tags(annotation) if item else [None]
        for tag in tags:
            prefix = path if tag is None else f"{path}[{tag}]"
            if tag:  # a tagged item is a row of its own; its `type` is that row
                out.add(prefix)
            for name, field in annotation.model_fields.items():
                key = field.alias or name
                if tag and key == "type":
                    continue
                sub = f"{prefix}.{key}" if prefix else key
                out.add(sub)
                _walk(field.annotation, sub, out)


def schema_paths(api: Api) -> set[str]:
    out: set[str] = set()
    _walk(MODELS[api], "", out)
    return {contract.canonical(api, p) for p in out}


@pytest.mark.parametrize("api", list(TABLES))
def test_every_schema_field_is_classified(api: Api) -> None:
    rows = {r.path for r in TABLES[api]}
    unclassified = sorted(schema_paths(api) - rows)
    assert not unclassified, f"{api}: fields the schema accepts without a row in api/contract.py"


@pytest.mark.parametrize("api", list(TABLES))
def test_every_row_is_a_field_the_schema_accepts(api: Api) -> None:
    stale = sorted({r.path for r in TABLES[api]} - schema_paths(api))
    assert not stale, f"{api}: rows in api/contract.py that no request field has (add it to schema.py)"


def test_rows_are_unique_and_explained() -> None:
    for api, rows in TABLES.items():
        paths = [r.path for r in rows]
        assert len(paths) == len(set(paths)), api
        assert all(r.note.strip() for r in rows), api


# -- the keys the decoders read -------------------------------------------------------------------

_READERS = {
    "req_str", "opt_str", "opt_int", "opt_bool", "opt_dict", "opt_number", "req_name", "checked_id",
    "opt_list",
}  # fmt: skip


def decoder_keys(path: Path) -> set[str]:
    """String keys a decoder reads: `x.get("k")`, `x["k"]`, `"k" in x` and `opt_*(x, "k", …)`."""
    keys: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            index = (
                0 if name == "get" and isinstance(func, ast.Attribute) else 1 if name in _READERS else None
            )
            if index is not None and len(node.args) > index:
                arg = node.args[index]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    keys.add(arg.value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            keys.add(node.slice.value)
    return keys


@pytest.mark.parametrize("api", list(TABLES))
def test_every_key_a_decoder_reads_is_classified(api: Api) -> None:
    leaves = {r.path.rsplit(".", 1)[-1].split("[", 1)[0] for r in TABLES[api]}
    leaves |= set(contract.FREEFORM_KEYS[api])
    read = set().union(*(decoder_keys(p) for p in [DECODERS[api], *SHARED]))
    assert read, "the AST walk found nothing: the reader names changed?"
    unclassified = sorted(read - leaves)
    assert not unclassified, f"{api}: the decoder reads keys no row classifies"


# -- refused rows are refused ---------------------------------------------------------------------

BASES: dict[Api, dict[str, Any]] = {
    "anthropic": {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
}


def _decode(api: Api, body: dict[str, Any]) -> Any:
    if api == "anthropic":
        return decode_messages(body)
    if api == "chat":
        return decode_chat(body)
    return decode_responses(body, signer=Signer(b"k" * 32))


REFUSED = [(api, r) for api, rows in TABLES.items() for r in rows if r.kind == "refused"]


@pytest.mark.parametrize(("api", "row"), REFUSED, ids=[f"{a}:{r.path}" for a, r in REFUSED])
def test_a_refused_field_is_a_400_naming_it(api: Api, row: contract.FieldRule) -> None:
    assert row.probe is not None, "a refused row needs a probe"
    body = copy.deepcopy(BASES[api]) | copy.deepcopy(dict(row.probe))
    with pytest.raises(ApiError) as caught:
        _decode(api, body)
    assert caught.value.status == 400
    named = f"{caught.value.param or ''} {caught.value.message}"
    field = row.path.rsplit(".", 1)[-1].split("[", 1)[0]
    assert field in named, f"the 400 does not name {field!r}: {named}"


@pytest.mark.parametrize("api", list(TABLES))
def test_ignored_top_level_fields_are_reported(api: Api) -> None:
    names = sorted(contract.ignored_top_level(api))
    typed = {"cache_control": {"type": "ephemeral"}}  # fields the decoder still type-checks
    body = BASES[api] | {name: typed.get(name, "x") for name in names if name != "metadata"}
    assert set(_decode(api, body).ignored) >= {n for n in names if n != "metadata"}


# -- the documented table -------------------------------------------------------------------------


def test_the_docs_carry_the_table() -> None:
    doc = (ROOT / "docs/api-contract.md").read_text(encoding="utf-8")
    assert contract.with_table(doc) == doc, "run: python -m agentserve.api.contract_docs docs/api-contract.md"
