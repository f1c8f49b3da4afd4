from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import settings

# Test helper modules (e.g. corpus_cases) import by their bare name from their own directory.
sys.path.insert(0, str(Path(__file__).parent / "unit" / "families"))

settings.register_profile("ci", max_examples=200, deadline=None)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile("ci")

# Shared helpers for the Kubernetes tests (tests/kubecheck.py), imported by bare name.
sys.path.insert(0, str(Path(__file__).parent))
