"""agentserve: an open serving stack for AI agents."""

__version__ = "0.1.0"
