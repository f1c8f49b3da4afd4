"""Writes the request-field table of `api/contract.py` into docs/api-contract.md (between markers).

    python -m agentserve.api.contract_docs docs/api-contract.md

A module of its own: `agentserve.api.contract` is imported by the decoders (run as `-m` it would be
imported twice).
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentserve.api.contract import with_table


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "docs/api-contract.md")
    path.write_text(with_table(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
