"""Real agent harnesses (installed by scripts/install-harnesses) against `agentserve up`."""

from __future__ import annotations

import sys
from pathlib import Path

# The helper modules here (harness_stack, harness_tools) import by their bare names.
sys.path.insert(0, str(Path(__file__).parent))
