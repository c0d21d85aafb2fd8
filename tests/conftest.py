from __future__ import annotations

import sys
from pathlib import Path

# make `tests.support` importable as `support` from every test module
sys.path.insert(0, str(Path(__file__).parent))
