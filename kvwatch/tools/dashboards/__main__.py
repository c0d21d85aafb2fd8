"""``python -m kvwatch.tools.dashboards [--root DIR] [--check]``: regenerate dashboards and recording rules.

Exit codes: 0 written / up to date; 1 ``--check`` found stale files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvwatch.tools.dashboards.build import stale_files, write_all


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvwatch.tools.dashboards", description=__doc__)
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: current directory)")
    p.add_argument("--check", action="store_true", help="only report files that differ; write nothing")
    args = p.parse_args(argv)
    if args.check:
        stale = stale_files(args.root)
        for rel in stale:
            print(f"stale: {rel} (run python -m kvwatch.tools.dashboards)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_all(args.root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
