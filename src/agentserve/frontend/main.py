"""`agentserve frontend`: the agent APIs over network workers or a router service."""

from __future__ import annotations

import contextlib
import logging

from agentserve.config import ConfigError, FrontendConfig, RouterConfig
from agentserve.frontend.app import create_app
from agentserve.frontend.backend import Backend
from agentserve.frontend.http import ApiKeys
from agentserve.frontend.up import event_loop_runner, load_pipeline, load_signer, serve

REMOTE_ROUTER_MODULE = "agentserve.router.remote"


def build_backend(config: FrontendConfig) -> Backend:
    if config.router_url is not None:
        # The router service and its client (agentserve.router.remote) are being built separately;
        # until they land the router is embedded in the frontend.
        raise ConfigError(
            f"router_url is set but this build has no router service client ({REMOTE_ROUTER_MODULE}); "
            "leave router_url unset and pass --worker-urls to embed the router"
        )
    if not config.worker_urls:
        raise ConfigError(
            "no workers: pass --worker-urls URL (repeatable) or --router-url (or use agentserve up)"
        )
    from agentserve.frontend.remote import WorkerSetBackend

    router = RouterConfig.model_validate({"block_size": config.block_size})
    return WorkerSetBackend(config.worker_urls, router)


def run_frontend(config: FrontendConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    backend = build_backend(config)
    try:
        keys = ApiKeys.load(config.api_keys_file)
    except OSError as exc:
        raise ConfigError(f"cannot read api_keys_file: {exc}") from exc
    app = create_app(config, backend, pipeline=load_pipeline(config), signer=load_signer(config), keys=keys)

    def banner(base_url: str) -> str:
        workers = ", ".join(config.worker_urls)
        return f"agentserve frontend on {base_url}: model {config.model}, workers {workers}\n"

    with contextlib.suppress(KeyboardInterrupt), event_loop_runner() as runner:
        runner.run(serve(app, config.host, config.port, banner))
    return 0
