"""`codex exec --output-schema FILE` against `agentserve up` (issue 22): Codex's final message is JSON
that validates against the schema, although the sim's script answers with prose around JSON that
breaks it (tests/harness/scenarios/codex-output-schema.yaml) — only the constraint makes it valid.

What Codex 0.169 sends, as captured here: the schema as the Responses `text.format`
(`{"type": "json_schema", "name": "codex_output_schema", "strict": true, "schema": …}`) alongside its
usual tools with `tool_choice: "auto"`, so the grammar allows calls or a final answer in the schema.
A relay between Codex and the stack records every request body; a failing assertion shows them."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from harness_stack import SCENARIOS, Stack, running_stack, scenario_args
from harness_tools import base_env, explain, require, run
from test_harness_codex import codex_home, items

pytestmark = pytest.mark.slow

TIMEOUT_S = 180.0
SCENARIO = "codex-output-schema.yaml"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 100},
        "confidence": {"type": "string", "enum": ["low", "medium", "high"]},
        "files": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["answer", "confidence", "files"],
    "additionalProperties": False,
}
_HOP = {"connection", "transfer-encoding", "content-length", "host", "keep-alive"}


class Relay:
    """A loopback HTTP relay to `upstream` that keeps the JSON body of every POST it forwards
    (responses are streamed back as they come, close-delimited)."""

    def __init__(self, upstream: str) -> None:
        self.bodies: list[dict[str, Any]] = []
        relay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reports
                pass

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with contextlib.suppress(ValueError):
                    relay.bodies.append(json.loads(body))
                self._forward(body)

            def _forward(self, body: bytes | None) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                request = urllib.request.Request(
                    upstream + self.path, data=body, headers=headers, method=self.command
                )
                try:
                    response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
                except urllib.error.HTTPError as exc:
                    response = exc
                with response:
                    self.send_response(response.status)
                    for key, value in response.headers.items():
                        if key.lower() not in _HOP:
                            self.send_header(key, value)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    while chunk := response.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                self.close_connection = True

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def describe(self) -> str:
        """The recorded bodies, Codex's long instructions and input cut short."""
        shown = []
        for body in self.bodies:
            brief = dict(body)
            brief["instructions"] = str(brief.get("instructions", ""))[:200]
            brief["input"] = str(brief.get("input", ""))[:600]
            brief["tools"] = [t.get("name", t.get("type")) for t in brief.get("tools") or []]
            shown.append(json.dumps(brief, indent=1))
        return "\n".join(shown)


@pytest.fixture(scope="module")
def binary() -> Path:
    return require("codex")


@pytest.fixture(scope="module")
def stack(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("codex-schema-stack"), scenario_args(SCENARIO)) as s:
        yield s


def scripted_answer() -> str:
    """The script's text after its reasoning block (what an unconstrained sim would answer)."""
    script = yaml.safe_load((SCENARIOS / SCENARIO).read_text())["default"]
    return str(script).split("</think>", 1)[1].strip()


def test_the_script_alone_would_not_validate() -> None:
    answer = scripted_answer()
    with pytest.raises(json.JSONDecodeError):
        json.loads(answer)
    embedded = json.loads(answer[answer.index("{") :])  # even the JSON inside it breaks the schema
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(embedded, SCHEMA)


def test_codex_exec_output_schema_writes_json_that_validates(
    binary: Path, stack: Stack, tmp_path: Path
) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    project = tmp_path / "project"
    project.mkdir()
    relay = Relay(stack.base_url)
    try:
        via = Stack(relay.base_url, stack.process, stack.log_path, stack.trace_path)
        env = base_env(
            tmp_path / "home",
            CODEX_HOME=str(codex_home(via, tmp_path / "codex-home")),
            AGENTSERVE_API_KEY="agentserve-test",
        )
        last = tmp_path / "last-message.txt"
        argv = [
            str(binary),
            "exec",
            "--skip-git-repo-check",
            "--json",
            "--dangerously-bypass-approvals-and-sandbox",
            "--output-schema",
            str(tmp_path / "schema.json"),
            "--output-last-message",
            str(last),
            "Report the answer, your confidence and the files you read.",
        ]
        result = run(argv, cwd=project, env=env, timeout=TIMEOUT_S)
    finally:
        relay.close()
    events = result.json_lines()
    try:
        with explain(result, log=stack.log()):
            assert result.returncode == 0
            assert items(events, "error") == []
            turns = [e["type"] for e in events if e.get("type", "").startswith("turn.")]
            assert turns[-1:] == ["turn.completed"]
            # The schema travelled as the Responses text format, on every model request of the turn.
            posts = [b for b in relay.bodies if "input" in b]
            assert posts, "Codex sent no Responses request"
            for body in posts:
                fmt = body["text"]["format"]
                assert fmt["type"] == "json_schema" and fmt["strict"] is True
                assert fmt["schema"] == SCHEMA
            assert len(posts) == 1  # the answer came at once: no tool call was steered in
            written = last.read_text()
            try:
                value = json.loads(written)
            except ValueError:
                raise AssertionError(f"Codex's final message is not JSON: {written!r}") from None
            errors = [e.message for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(value)]
            assert errors == [], written
            assert [m["text"] for m in items(events, "agent_message")] == [written]
            assert written.strip() != scripted_answer()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- request bodies Codex sent\n{relay.describe()}") from None
