"""State shared by frontend replicas: stored responses, remembered assistant turns (docs/state.md)."""

from agentserve.state.store import (
    InProcessStore,
    RedisStore,
    StateStore,
    StoreUnavailable,
    open_store,
    state_url,
)

__all__ = ["InProcessStore", "RedisStore", "StateStore", "StoreUnavailable", "open_store", "state_url"]
