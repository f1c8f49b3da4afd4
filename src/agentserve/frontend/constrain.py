"""The frontend's side of constrained decoding: a decoded request → its checked `Constraint`.

Pure building lives in `constraints.build`; this module is the edge that owns the grammar engine
for the served tokenizer (shared with an in-process sim worker), checks every enforced schema and
the whole grammar with llguidance (compiled once per distinct source: the bounded cache), and turns
what cannot be enforced into the API's own 400 naming the field — before any engine work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from agentserve.api.errors import InvalidRequestError
from agentserve.api.options import GenerationOptions
from agentserve.api.request import ApiName, DecodedRequest
from agentserve.constraints.build import ConstraintError, ParamKind, build, needs_constraint, plan
from agentserve.constraints.engine import GrammarEngine, engine_for, schema_error
from agentserve.constraints.spec import Constraint
from agentserve.families.base import Family
from agentserve.families.grammar import ANY_OBJECT, Markers, ToolGrammar

_TOOL_PARAM: dict[ApiName, str] = {
    "anthropic": "tools.{}.input_schema",
    "chat": "tools[{}].function.parameters",
    "responses": "tools[{}].parameters",
}
_TOOL_NAME_PARAM: dict[ApiName, str] = {
    "anthropic": "tools.{}.name",
    "chat": "tools[{}].function.name",
    "responses": "tools[{}].name",
}
_FORMAT_PARAM: dict[ApiName, str] = {
    "anthropic": "output_config.format.schema",
    "chat": "response_format.json_schema.schema",
    "responses": "text.format.schema",
}
_THINKING_PARAM: dict[ApiName, str] = {
    "anthropic": "thinking.budget_tokens",
    "chat": "reasoning_effort",
    "responses": "reasoning",
}


def binding_budget(
    options: GenerationOptions, grammar: ToolGrammar | None, max_tokens: int | None
) -> GenerationOptions:
    """`options` without a thinking budget that cannot bind (see `Constrainer.constraint`)."""
    reasoning = options.reasoning
    budget = reasoning.budget_tokens
    if budget is None:
        return options
    reasons = grammar is not None and (grammar.think is not None or grammar.layout is not None)
    if reasons and (max_tokens is None or budget < max_tokens):
        return options
    return replace(options, reasoning=replace(reasoning, budget_tokens=None))


def param_for(api: ApiName, kind: ParamKind, index: int | None = None) -> str:
    """The API's name of the field a constraint error is about."""
    if kind == "tools":
        return _TOOL_PARAM[api].format(index if index is not None else 0)
    if kind == "tool_name":
        return _TOOL_NAME_PARAM[api].format(index if index is not None else 0)
    if kind == "response_format":
        return _FORMAT_PARAM[api]
    if kind == "thinking":
        return _THINKING_PARAM[api]
    return "tool_choice"


class Constrainer:
    """Builds and checks constraints for one served family and tokenizer."""

    def __init__(
        self,
        family: Family,
        tokenizer_json: Callable[[], str | None],
        stop_ids: tuple[int, ...] = (),
        *,
        enabled: bool = True,
        cache_size: int = 256,
    ) -> None:
        self.family = family
        self.enabled = enabled
        self.stop_ids = stop_ids
        self._tokenizer_json = tokenizer_json
        self._cache_size = cache_size
        self._engine: GrammarEngine | None = None
        self._markers: Markers | None = None
        self._bytes: dict[int, bytes] = {}  # token id -> its bytes (bounded by the vocabulary)

    @property
    def engine(self) -> GrammarEngine:
        """Built on first use: a deployment that never constrains never builds a grammar tokenizer."""
        if self._engine is None:
            self._engine = engine_for(self._tokenizer_json(), cache_size=self._cache_size)
        return self._engine

    @property
    def markers(self) -> Markers:
        if self._markers is None:
            grammar = self.family.grammar
            strings = grammar.marker_strings if grammar is not None else ()
            self._markers = Markers(self.engine.specials(strings))
        return self._markers

    def token_bytes(self, token: int) -> bytes:
        """A token's exact bytes (log-probabilities show each token's text and bytes)."""
        raw = self._bytes.get(token)
        if raw is None:
            raw = self._bytes[token] = bytes(self.engine.tokenizer().decode_bytes([token]))
        return raw

    def check_logit_bias(self, request: DecodedRequest) -> None:
        """Every biased token is one of the served model's. Raises InvalidRequestError."""
        bias = request.options.logit_bias
        if not bias:
            return
        vocab = self.engine.tokenizer().vocab_size
        for token, _ in bias:
            if token >= vocab:
                raise InvalidRequestError(
                    f"Invalid key in 'logit_bias': {token} is not a token of this model (0..{vocab - 1}).",
                    param="logit_bias",
                )

    def drops_tools(self, request: DecodedRequest) -> bool:
        """tool_choice none: leave the tools out of the prompt where the family's template renders
        nothing for an empty list (its `ToolGrammar.renders_nothing_without_tools`)."""
        grammar = self.family.grammar
        return (
            request.options.tool_choice.mode == "none"
            and bool(request.conversation.tools)
            and grammar is not None
            and grammar.renders_nothing_without_tools
        )

    def constraint(
        self, request: DecodedRequest, *, starts_in_reasoning: bool, max_tokens: int | None = None
    ) -> Constraint | None:
        """The request's checked constraint (None: it needs none). Raises InvalidRequestError.

        A thinking budget binds only where the family has a reasoning block and the budget is below
        the output's own limit (`max_tokens`, as clamped): Claude Code's `budget_tokens` 31999 with
        `max_tokens` 32000, or any budget on a family that cannot reason, needs no grammar."""
        options = binding_budget(request.options, self.family.grammar, max_tokens)
        tools = request.conversation.tools
        if not needs_constraint(options, tools):
            return None
        api = request.api
        if not self.enabled:
            raise InvalidRequestError(
                "constrained decoding is turned off on this deployment (tool_choice, "
                "parallel_tool_calls, strict tools, output formats and thinking budgets need it)",
                param="tool_choice",
            )
        try:
            body = plan(options, tools)
            for tool in body.tools:
                if tool.schema is ANY_OBJECT:
                    continue
                error = schema_error(tool.schema)
                if error is not None:
                    index = next(i for i, t in enumerate(tools) if t.name == tool.name)
                    raise ConstraintError(
                        f"Invalid schema for function {tool.name!r}: {error}", "tools", index
                    )
            fmt = options.response_format
            if body.json_schema is not None and fmt is not None and fmt.schema is not None:
                error = schema_error(body.json_schema)
                if error is not None:
                    name = f" {fmt.name!r}" if fmt.name else ""
                    raise ConstraintError(
                        f"Invalid schema for response_format{name}: {error}", "response_format"
                    )
            constraint = build(
                options,
                tools,
                self.family.grammar,
                self.markers if self.family.grammar is not None else Markers(),
                family=self.family.name,
                starts_in_reasoning=starts_in_reasoning,
            )
        except ConstraintError as exc:
            raise InvalidRequestError(str(exc), param=param_for(api, exc.kind, exc.index)) from None
        if constraint is None:
            return None
        error = self.engine.check(constraint.grammar, self.stop_ids)
        if error is not None:
            # llguidance's first line says why; the lines after it quote the grammar built here,
            # which is this server's, not the request's
            reason = error.strip().splitlines()[0] if error.strip() else error
            raise InvalidRequestError(
                f"the request's tools and output format cannot be enforced: {reason}", param="tools"
            )
        return constraint
