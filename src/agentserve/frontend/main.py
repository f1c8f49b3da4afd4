"""`agentserve frontend`: the agent APIs over network workers or a router service."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Sequence

from agentserve.config import ConfigError, FrontendConfig
from agentserve.eventloop import event_loop_runner
from agentserve.frontend import processes
from agentserve.frontend.app import create_app
from agentserve.frontend.backend import Backend, RoutedBackend
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.up import load_pipeline, load_signer, serve


def build_backend(config: FrontendConfig) -> Backend:
    """Workers through a router service (`router_url`) or an embedded router over `worker_urls`."""
    if not config.router_url and not config.worker_urls:
        raise ConfigError(
            "no workers: pass --router-url (a router service) or --worker-urls URL (repeatable) to embed "
            "the router (or use agentserve up)"
        )
    if config.prefill_worker_urls and (config.router_url or not config.worker_urls):
        raise ConfigError(
            "--prefill-worker-urls go with --worker-urls (the embedded router); a router service takes "
            "them as its own --prefill-workers"
        )
    return RoutedBackend(config)


def run_frontend(config: FrontendConfig, argv: Sequence[str] | None = None) -> int:
    """Serve; with `processes` > 1, supervise that many copies of this command (`processes.py`)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    processes.check(config)
    index = processes.child_index()
    if config.processes > 1 and index is None:
        build_backend(config)  # the configuration errors a child would hit, before any starts
        load_pipeline(config)
        return processes.Supervisor(config, sys.argv[1:] if argv is None else argv).run()
    sock = None
    if index is not None:
        config = processes.child_config(config, index)
        sock = processes.listening_socket(config.host)
    backend = build_backend(config)
    try:
        keys = ApiKeys.load(config.api_keys_file)
    except OSError as exc:
        raise ConfigError(f"cannot read api_keys_file: {exc}") from exc
    app = create_app(config, backend, pipeline=load_pipeline(config), signer=load_signer(config), keys=keys)

    def banner(base_url: str) -> str:
        via = (
            f"router {config.router_url}" if config.router_url else "workers " + ", ".join(config.worker_urls)
        )
        return f"agentserve frontend on {base_url}: model {config.model}, {via}\n"

    with contextlib.suppress(KeyboardInterrupt), event_loop_runner() as runner:
        runner.run(serve(app, config.host, config.port, banner if not index else None, sock=sock))
    return 0
