"""The generate API's wire format (pure): request bodies, response frames, and three framings.

Request body (JSON or msgpack, same shape)::

    {"request_id": "r1",                      # optional; the worker makes one up otherwise
     "token_ids": [151644, 872, ...],         # the prompt, already tokenized by the frontend
     "sampling": {"max_tokens": 512, "temperature": 0.6, "stop": ["</answer>"], ...},
     "priority": 0,                           # optional; higher first
     "hints": {"turn": 2, "last_user_message": "...", "last_message": "..."},   # optional
     "constraint": {"grammar": "start: …", "json_schema": {...}}}              # optional

Response: a stream of frames, one per step (`Step`), each a mapping::

    {"token_ids": [...], "text": "...", "cached_tokens": 96}          # first frame
    {"token_ids": [...], "text": "..."}
    {"token_ids": [...], "text": "...", "finish_reason": "stop",
     "usage": {"input_tokens": 130, "output_tokens": 57, "cached_tokens": 96}}   # last frame
    {"error": {"type": "engine_error", "message": "..."}}             # instead, if the engine fails

framed as NDJSON (`application/x-ndjson`, the default), msgpack (`application/x-msgpack`: concatenated
msgpack maps) or server-sent events (`text/event-stream`: `data: <json>\\n\\n`). docs/worker.md has the
measurements behind the default.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeAlias, get_args

import msgpack

from agentserve.constraints.spec import Constraint
from agentserve.conversation import FinishReason, Usage
from agentserve.sampling import SAMPLERS
from agentserve.worker.engine import (
    RETENTION_PRIORITY_MAX,
    RETENTION_PRIORITY_MIN,
    SAMPLING_FIELDS,
    GenerateRequest,
    Hints,
    KvTransfer,
    Retention,
    SamplingParams,
    Step,
    TokenLogprob,
    TokenRangeRetention,
    samplers_and_stops,
)

Frame: TypeAlias = dict[str, Any]
Framing: TypeAlias = Literal["ndjson", "msgpack", "sse"]

FINISH_REASONS: frozenset[str] = frozenset(get_args(FinishReason))
MEDIA_TYPES: dict[Framing, str] = {
    "ndjson": "application/x-ndjson",
    "msgpack": "application/x-msgpack",
    "sse": "text/event-stream",
}
_FRAMING_BY_MEDIA: dict[str, Framing] = {
    "application/x-ndjson": "ndjson",
    "application/jsonl": "ndjson",
    "application/x-msgpack": "msgpack",
    "application/msgpack": "msgpack",
    "application/vnd.msgpack": "msgpack",
    "text/event-stream": "sse",
}
DEFAULT_FRAMING: Framing = "ndjson"


class WireError(ValueError):
    """A request body that does not follow the wire format (answered with 400)."""


# --------------------------------------------------------------------------------------------------
# Requests


def encode_request(request: GenerateRequest) -> Frame:
    s = request.sampling
    sampling: dict[str, Any] = {"max_tokens": s.max_tokens, **samplers_and_stops(s)}
    if s.ignore_eos:
        sampling["ignore_eos"] = True
    if s.include_stop:
        sampling["include_stop"] = True
    if s.logprobs is not None:
        sampling["logprobs"] = s.logprobs
    if s.logit_bias:
        sampling["logit_bias"] = [[token, bias] for token, bias in s.logit_bias]
    body: Frame = {"token_ids": list(request.prompt_token_ids), "sampling": sampling}
    if request.request_id:
        body["request_id"] = request.request_id
    if request.priority:
        body["priority"] = request.priority
    if request.cache_salt is not None:
        body["cache_salt"] = request.cache_salt
    if request.dp_rank is not None:
        body["dp_rank"] = request.dp_rank
    if request.hints is not None:
        h = request.hints
        body["hints"] = {
            k: v
            for k, v in (
                ("turn", h.turn),
                ("last_user_message", h.last_user_message),
                ("last_message", h.last_message),
                ("resumed_tokens", h.resumed_tokens or None),
            )
            if v is not None
        }
    if request.retention is not None:
        body["retention"] = encode_retention(request.retention)
    if request.constraint is not None:
        body["constraint"] = encode_constraint(request.constraint)
    if request.context_only:
        body["context_only"] = True
    if request.kv_transfer is not None:
        body["kv_transfer"] = encode_kv_transfer(request.kv_transfer)
    return body


MAX_HANDLE_CHARS = 16384  # TensorRT-LLM's handle carries its DisaggregatedParams (opaque state included)


def encode_kv_transfer(t: KvTransfer) -> Frame:
    return {"handle": t.handle, "tokens": t.tokens, "source": t.source, "seconds": t.seconds}


def decode_kv_transfer(raw: Any) -> KvTransfer:
    if not isinstance(raw, Mapping) or set(raw) - {"handle", "tokens", "source", "seconds"}:
        raise WireError("kv_transfer must be an object of handle, tokens, source, seconds")
    handle, tokens = raw.get("handle"), raw.get("tokens")
    source, seconds = raw.get("source", ""), raw.get("seconds", 0.0)
    if not isinstance(handle, str) or not handle or len(handle) > MAX_HANDLE_CHARS:
        raise WireError(
            f"kv_transfer.handle must be a non-empty string of at most {MAX_HANDLE_CHARS} characters"
        )
    if type(tokens) is not int or tokens < 0:
        raise WireError("kv_transfer.tokens must be a non-negative integer")
    if not isinstance(source, str) or len(source) > 2048:
        raise WireError("kv_transfer.source must be a string")
    if type(seconds) not in (int, float) or not 0 <= seconds < 3600:
        raise WireError("kv_transfer.seconds must be a number in [0, 3600)")
    return KvTransfer(handle, tokens, source, float(seconds))


MAX_GRAMMAR_CHARS = 4 << 20  # a constraint's grammar source (128 tools with large schemas fit)


def encode_constraint(c: Constraint) -> Frame:
    out: Frame = {"grammar": c.grammar}
    if c.json_schema is not None:
        out["json_schema"] = dict(c.json_schema)
    return out


def decode_constraint(raw: Any) -> Constraint:
    """A constraint as `encode_constraint` writes it."""
    if not isinstance(raw, Mapping):
        raise WireError("constraint must be an object")
    unknown = set(raw) - {"grammar", "json_schema"}
    if unknown:
        raise WireError(f"unknown constraint fields: {', '.join(sorted(map(str, unknown)))}")
    grammar = raw.get("grammar")
    if not isinstance(grammar, str) or not grammar or len(grammar) > MAX_GRAMMAR_CHARS:
        raise WireError(
            f"constraint.grammar must be a non-empty string of at most {MAX_GRAMMAR_CHARS} characters"
        )
    schema = raw.get("json_schema")
    if schema is not None and not isinstance(schema, Mapping):
        raise WireError("constraint.json_schema must be an object")
    return Constraint(grammar, dict(schema) if schema is not None else None)


def encode_retention(r: Retention) -> Frame:
    out: Frame = {"ranges": [[x.start, x.end, x.priority, x.duration_s] for x in r.ranges]}
    if r.decode_priority is not None:
        out["decode_priority"] = r.decode_priority
    if r.decode_duration_s is not None:
        out["decode_duration_s"] = r.decode_duration_s
    return out


def decode_retention(raw: Any) -> Retention:
    """A retention as `encode_retention` writes it: ranges [start, end|null, priority, seconds|null]."""
    if not isinstance(raw, Mapping):
        raise WireError("retention must be an object")
    unknown = set(raw) - {"ranges", "decode_priority", "decode_duration_s"}
    if unknown:
        raise WireError(f"unknown retention fields: {', '.join(sorted(map(str, unknown)))}")
    ranges = raw.get("ranges") or []
    if not isinstance(ranges, list) or len(ranges) > 64:
        raise WireError("retention.ranges must be an array of at most 64 ranges")
    out: list[TokenRangeRetention] = []
    for item in ranges:
        if not isinstance(item, list | tuple) or len(item) != 4:
            raise WireError("a retention range is [start, end, priority, duration_s]")
        start, end, prio, dur = item
        if not _int(start) or start < 0 or (end is not None and (not _int(end) or end <= start)):
            raise WireError("retention range bounds must be integers with 0 <= start < end")
        out.append(TokenRangeRetention(start, end, _priority(prio), _duration(dur)))
    dp = raw.get("decode_priority")
    return Retention(
        tuple(out), None if dp is None else _priority(dp), _duration(raw.get("decode_duration_s"))
    )


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _priority(v: Any) -> int:
    if not _int(v) or not RETENTION_PRIORITY_MIN <= v <= RETENTION_PRIORITY_MAX:
        raise WireError("retention priorities are integers within 0..100")
    return int(v)


def _duration(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
        raise WireError("retention durations are positive numbers of seconds (or null)")
    return float(v)


def _opt(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise WireError(f"{where}{key} must be a number")
    if not isinstance(value, kind):
        raise WireError(f"{where}{key} has the wrong type")
    return value


def _strings(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WireError(f"{where}{key} must be a string or a list of strings")
    return tuple(value)


def _token_ids(value: Any, what: str) -> array[int]:
    if not isinstance(value, list):
        raise WireError(f"{what} must be a list of token ids")
    try:
        return array("I", value)  # C-speed check: integers in [0, 2**32)
    except (TypeError, OverflowError) as exc:
        raise WireError(f"{what} must be non-negative 32-bit integers") from exc


MAX_TOP_LOGPROBS = 20  # OpenAI's limit on alternatives per token
MAX_LOGIT_BIAS = 1024  # (token, bias) pairs per request (OpenAI takes 300)


def _logprobs(raw: Mapping[str, Any]) -> int | None:
    value = raw.get("logprobs")
    if value is not None and (type(value) is not int or not 0 <= value <= MAX_TOP_LOGPROBS):
        raise WireError(f"sampling.logprobs must be an integer in 0..{MAX_TOP_LOGPROBS}")
    return value


def _logit_bias(raw: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    value = raw.get("logit_bias") or []
    if not isinstance(value, list) or len(value) > MAX_LOGIT_BIAS:
        raise WireError(f"sampling.logit_bias must be a list of at most {MAX_LOGIT_BIAS} [token id, bias]")
    pairs: list[tuple[int, float]] = []
    for pair in value:
        if not (
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and type(pair[0]) is int
            and pair[0] >= 0
            and type(pair[1]) in (int, float)
            and -100 <= pair[1] <= 100
        ):
            raise WireError("a sampling.logit_bias entry is [token id ≥ 0, bias in -100..100]")
        pairs.append((pair[0], float(pair[1])))
    return tuple(pairs)


def decode_request(data: Any) -> GenerateRequest:
    if not isinstance(data, Mapping):
        raise WireError("the request body must be an object")
    known = {
        "request_id",
        "token_ids",
        "sampling",
        "priority",
        "hints",
        "cache_salt",
        "retention",
        "dp_rank",
        "constraint",
        "context_only",
        "kv_transfer",
    }
    unknown = set(data) - known
    if unknown:
        raise WireError(f"unknown fields: {', '.join(sorted(map(str, unknown)))}")
    if "token_ids" not in data:
        raise WireError("token_ids is required")
    ids = _token_ids(data["token_ids"], "token_ids")
    rid = data.get("request_id") or ""
    if not isinstance(rid, str) or len(rid) > 256:
        raise WireError("request_id must be a string of at most 256 characters")
    priority = _opt(data, "priority", int, "") or 0
    raw = data.get("sampling") or {}
    if not isinstance(raw, Mapping):
        raise WireError("sampling must be an object")
    unknown = set(raw) - SAMPLING_FIELDS
    if unknown:
        raise WireError(f"unknown sampling fields: {', '.join(sorted(map(str, unknown)))}")
    w = "sampling."
    max_tokens = _opt(raw, "max_tokens", int, w)
    if max_tokens is None or max_tokens < 1:
        raise WireError("sampling.max_tokens is required and must be at least 1")
    ignore_eos = raw.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise WireError("sampling.ignore_eos must be a boolean")
    include_stop = raw.get("include_stop", False)
    if not isinstance(include_stop, bool):
        raise WireError("sampling.include_stop must be a boolean")
    sampling = SamplingParams(
        max_tokens=max_tokens,
        **{name: _opt(raw, name, kind, w) for name, kind in SAMPLERS},
        stop=_strings(raw, "stop", w),
        stop_token_ids=tuple(_token_ids(raw.get("stop_token_ids") or [], "sampling.stop_token_ids")),
        ignore_eos=ignore_eos,
        include_stop=include_stop,
        logprobs=_logprobs(raw),
        logit_bias=_logit_bias(raw),
    )
    hints = None
    raw_hints = data.get("hints")
    if raw_hints is not None:
        if not isinstance(raw_hints, Mapping):
            raise WireError("hints must be an object")
        unknown = set(raw_hints) - {"turn", "last_user_message", "last_message", "resumed_tokens"}
        if unknown:
            raise WireError(f"unknown hints: {', '.join(sorted(map(str, unknown)))}")
        turn = _opt(raw_hints, "turn", int, "hints.")
        if turn is not None and turn < 1:
            raise WireError("hints.turn must be at least 1")
        resumed = _opt(raw_hints, "resumed_tokens", int, "hints.")
        if resumed is not None and resumed < 0:
            raise WireError("hints.resumed_tokens must not be negative")
        hints = Hints(
            turn,
            _opt(raw_hints, "last_user_message", str, "hints."),
            _opt(raw_hints, "last_message", str, "hints."),
            resumed or 0,
        )
    salt = data.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt or len(salt) > 256):
        raise WireError("cache_salt must be a non-empty string of at most 256 characters")
    raw_retention = data.get("retention")
    retention = None if raw_retention is None else decode_retention(raw_retention)
    dp_rank = data.get("dp_rank")
    if dp_rank is not None and (type(dp_rank) is not int or not 0 <= dp_rank < 1024):
        raise WireError("dp_rank must be an integer in 0..1023")
    raw_constraint = data.get("constraint")
    constraint = None if raw_constraint is None else decode_constraint(raw_constraint)
    context_only = data.get("context_only", False)
    if not isinstance(context_only, bool):
        raise WireError("context_only must be a boolean")
    raw_transfer = data.get("kv_transfer")
    kv_transfer = None if raw_transfer is None else decode_kv_transfer(raw_transfer)
    if context_only and kv_transfer is not None:
        raise WireError("a request is either context_only or carries a kv_transfer, not both")
    return GenerateRequest(
        rid,
        ids,
        sampling,
        priority,
        hints,
        retention,
        cache_salt=salt,
        dp_rank=dp_rank,
        constraint=constraint,
        context_only=context_only,
        kv_transfer=kv_transfer,
    )


# --------------------------------------------------------------------------------------------------
# Frames


def step_to_frame(step: Step) -> Frame:
    frame: Frame = {"token_ids": step.token_ids, "text": step.text}
    if step.logprobs is not None:  # [token id, log-probability, [[token id, log-probability], …]]
        frame["logprobs"] = [[e.token_id, e.logprob, [list(t) for t in e.top]] for e in step.logprobs]
    if step.cached_tokens is not None:
        frame["cached_tokens"] = step.cached_tokens
    if step.received_tokens is not None:
        frame["received_tokens"] = step.received_tokens
    if step.kv_transfer is not None:
        frame["kv_transfer"] = encode_kv_transfer(step.kv_transfer)
    if step.finish_reason is not None:
        frame["finish_reason"] = step.finish_reason
        u = step.usage or Usage()
        frame["usage"] = {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cached_tokens": u.cached_tokens,
        }
    return frame


def error_frame(kind: str, message: str) -> Frame:
    return {"error": {"type": kind, "message": message}}


class StreamError(RuntimeError):
    """The worker reported an error in the middle of a stream."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def frame_to_step(frame: Frame) -> Step:
    """Raises `StreamError` for an error frame, `WireError` for a malformed one."""
    try:
        if "error" in frame:
            err = frame["error"]
            raise StreamError(str(err.get("type", "error")), str(err.get("message", "")))
        if len(frame) == 2:  # the common step: token ids and text only
            return Step(frame["token_ids"], frame["text"])
        reason = frame.get("finish_reason")
        usage = None
        if reason is not None:
            if reason not in FINISH_REASONS:
                raise WireError(f"unknown finish_reason {reason!r}")
            u = frame.get("usage") or {}
            usage = Usage(
                input_tokens=u.get("input_tokens", 0),
                output_tokens=u.get("output_tokens", 0),
                cached_tokens=u.get("cached_tokens", 0),
            )
        raw = frame.get("logprobs")
        raw_transfer = frame.get("kv_transfer")
        return Step(
            frame["token_ids"],
            frame["text"],
            frame.get("cached_tokens"),
            reason,
            usage,
            logprobs=None if raw is None else [_token_logprob(e) for e in raw],
            kv_transfer=None if raw_transfer is None else decode_kv_transfer(raw_transfer),
            received_tokens=frame.get("received_tokens"),
        )
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        if isinstance(exc, WireError):
            raise
        raise WireError(f"malformed frame: {frame!r}") from exc


def _token_logprob(raw: Any) -> TokenLogprob:
    token, logprob, top = raw
    return TokenLogprob(int(token), float(logprob), tuple((int(t), float(lp)) for t, lp in top))


# --------------------------------------------------------------------------------------------------
# Framings


class FrameDecoder(Protocol):
    def feed(self, data: bytes) -> list[Frame]: ...


def _json_bytes(frame: Frame) -> bytes:
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode()


def encode_frame(framing: Framing, frame: Frame) -> bytes:
    if framing == "msgpack":
        return msgpack.packb(frame)  # type: ignore[no-any-return]
    if framing == "ndjson":
        return _json_bytes(frame) + b"\n"
    return b"data: " + _json_bytes(frame) + b"\n\n"


class _LineDecoder:
    def __init__(self, separator: bytes, prefix: bytes) -> None:
        self._buf = b""
        self._sep = separator
        self._prefix = prefix

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf + data
        *records, self._buf = buf.split(self._sep)
        frames = []
        for record in records:
            if not record.strip():
                continue
            if self._prefix:
                # SSE: one `data:` line per event here; comments and other fields are skipped.
                lines = [ln[len(self._prefix) :] for ln in record.split(b"\n") if ln.startswith(self._prefix)]
                if not lines:
                    continue
                record = b"\n".join(lines)
            try:
                frames.append(json.loads(record))
            except ValueError as exc:
                raise WireError(f"malformed frame {record[:80]!r}") from exc
        return frames


class _MsgpackDecoder:
    def __init__(self) -> None:
        self._unpacker = msgpack.Unpacker(raw=False)

    def feed(self, data: bytes) -> list[Frame]:
        self._unpacker.feed(data)
        try:
            return list(self._unpacker)
        except ValueError as exc:
            raise WireError("malformed msgpack frame") from exc


def frame_decoder(framing: Framing) -> FrameDecoder:
    if framing == "msgpack":
        return _MsgpackDecoder()
    if framing == "ndjson":
        return _LineDecoder(b"\n", b"")
    return _LineDecoder(b"\n\n", b"data: ")


def framing_for_accept(accept: str | None) -> Framing:
    """The framing an `Accept` header asks for (first known media type), else the default."""
    if accept:
        for part in accept.split(","):
            media = part.split(";", 1)[0].strip().lower()
            framing = _FRAMING_BY_MEDIA.get(media)
            if framing is not None:
                return framing
    return DEFAULT_FRAMING


def decode_body(content_type: str | None, body: bytes) -> Any:
    """Parse a request body as msgpack or JSON (by Content-Type; JSON when absent)."""
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    try:
        if _FRAMING_BY_MEDIA.get(media) == "msgpack":
            return msgpack.unpackb(body, raw=False)
        if media in ("application/json", ""):
            return json.loads(body)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise WireError(f"the request body is not valid {media}: {exc}") from exc
    raise WireError(f"unsupported content type {media!r}; send application/json or application/x-msgpack")
