"""The router: KV-aware, priority-aware placement of requests on workers."""
