from __future__ import annotations

import sys
from pathlib import Path

# Helpers imported by bare name: this directory's, and the prompt tests' per-family raw outputs.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "prompt"))
