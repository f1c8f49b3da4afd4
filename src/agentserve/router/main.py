"""`agentserve router`: the router service from its configuration."""

from __future__ import annotations

import logging

from agentserve.config import ConfigError, RouterConfig
from agentserve.router.discovery import static_endpoints

log = logging.getLogger("agentserve.router")


async def serve(config: RouterConfig) -> None:
    import uvicorn

    from agentserve.router.local import LocalRouter
    from agentserve.router.service import create_app

    router = LocalRouter(config)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(router), host=config.host, port=config.port, log_level="warning", access_log=False
        )
    )
    source = (
        f"EndpointSlices of {config.namespace or '(pod namespace)'}/{config.worker_service}"
        if config.discovery == "kubernetes"
        else f"{len(config.workers)} static workers"
        + (f" and {len(config.prefill_workers)} prefill workers" if config.prefill_workers else "")
    )
    log.warning(
        "agentserve router: %s policy on http://%s:%d, workers from %s",
        config.policy,
        config.host,
        config.port,
        source,
    )
    await server.serve()


def run(config: RouterConfig) -> int:
    """`agentserve router`: validate what the model alone cannot, then serve until interrupted."""
    if config.discovery == "kubernetes" and not config.worker_service:
        raise ConfigError("--discovery kubernetes needs --worker-service")
    try:
        static_endpoints([*config.workers, *config.prefill_workers])
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    from agentserve.eventloop import event_loop_runner

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with event_loop_runner() as runner:
        runner.run(serve(config))
    return 0
