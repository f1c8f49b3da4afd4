"""A loopback stand-in for the Kubernetes API server's EndpointSlice list and watch.

No kube-apiserver can run in this environment, so the watch edge is tested against this: the
same HTTP shapes the real server gives the official client (a JSON list with
`metadata.resourceVersion`; a watch as a chunked stream of `{"type", "object"}` lines, an
`ERROR` event with a 410 Status when the version expired), nothing more.
"""

from __future__ import annotations

import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

PATH = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"


class FakeApiServer:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.slices: dict[str, dict[str, Any]] = {}
        self.version = 1
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self._watchers: list[queue.Queue[dict[str, Any] | None]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_watches()
        self._server.shutdown()
        self._server.server_close()

    # -- what the test does ------------------------------------------------------------------------

    def put(self, obj: dict[str, Any]) -> None:
        with self._lock:
            self.version += 1
            name = obj["metadata"]["name"]
            kind = "MODIFIED" if name in self.slices else "ADDED"
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
            self.slices[name] = obj
            self._send({"type": kind, "object": obj})

    def delete(self, name: str) -> None:
        with self._lock:
            self.version += 1
            obj = self.slices.pop(name)
            self._send({"type": "DELETED", "object": obj})

    def expire(self) -> None:
        """The watched version is too old (etcd compacted): watchers get 410 Gone."""
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                  "message": "too old resource version", "code": 410}  # fmt: skip
        with self._lock:
            self._send({"type": "ERROR", "object": status})

    def close_watches(self) -> None:
        with self._lock:
            for w in self._watchers:
                w.put(None)
            self._watchers.clear()

    def watchers(self) -> int:
        with self._lock:
            return len(self._watchers)

    def _send(self, event: dict[str, Any]) -> None:
        for w in self._watchers:
            w.put(event)

    # -- HTTP --------------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                fake.requests.append((url.path, query))
                if url.path != PATH.format(ns=fake.namespace):
                    self._json(404, {"kind": "Status", "code": 404, "message": "not found"})
                    return
                if query.get("watch", ["false"])[0] in ("true", "1"):
                    self._watch()
                    return
                with fake._lock:
                    body = {
                        "kind": "EndpointSliceList",
                        "apiVersion": "discovery.k8s.io/v1",
                        "metadata": {"resourceVersion": str(fake.version)},
                        "items": list(fake.slices.values()),
                    }
                self._json(200, body)

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _watch(self) -> None:
                events: queue.Queue[dict[str, Any] | None] = queue.Queue()
                with fake._lock:
                    fake._watchers.append(events)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    for _ in range(10_000):  # bounded: a test never sends this many
                        event = events.get(timeout=30)
                        if event is None:
                            break
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                        if event["type"] == "ERROR":
                            break
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (OSError, queue.Empty):
                    pass
                finally:
                    with fake._lock:
                        if events in fake._watchers:
                            fake._watchers.remove(events)
                self.close_connection = True

        return Handler
