from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "worker"))
sys.path.insert(0, str(Path(__file__).parent))

from tiny_tokenizer import tiny_tokenizer

from agentserve.worker.tokenizer import HFTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> HFTokenizer:
    return HFTokenizer(tiny_tokenizer())
