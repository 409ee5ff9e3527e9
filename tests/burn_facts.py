"""What Burn says, kept in the repository so that no test reads outside it.

VECTORS: burn-vectors.json (Burn's literals and the specs' worked examples). BURN_FIXTURES: files that
Burn itself wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data"
VECTORS = json.loads((DATA / "burn-vectors.json").read_text())
BURN_FIXTURES = DATA / "burn"
