from __future__ import annotations

import sys
from pathlib import Path

# `served` (a worker app on a real loopback uvicorn server) lives with the worker's tests.
sys.path.insert(0, str(Path(__file__).parents[1] / "worker"))
sys.path.insert(0, str(Path(__file__).parent))
