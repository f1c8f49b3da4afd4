from __future__ import annotations

import sys
from pathlib import Path

# `Processes` (real agentserve processes) and the sim scenarios live with the router's and the
# frontend's tests.
sys.path.insert(0, str(Path(__file__).parents[1] / "router"))
sys.path.insert(0, str(Path(__file__).parents[1] / "frontend"))
