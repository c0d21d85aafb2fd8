"""Regenerate ``rules.yaml`` (the kvwatch-rules ConfigMap) from the bundled rules.

Run from anywhere: ``python deploy/kubernetes/sync_rules.py``. The deploy tests
fail when the ConfigMap and ``rules/kvwatch/*.yaml`` drift apart.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RULES_DIR = HERE.parent.parent / "rules" / "kvwatch"

HEADER = """\
# kvwatch classification rules, mounted at /etc/kvwatch/rules. Generated from
# rules/kvwatch/*.yaml by deploy/kubernetes/sync_rules.py (a test keeps them in
# sync). To tune thresholds for your fleet edit your copy of this ConfigMap and
# validate the extracted file with `kvwatch check --rules FILE` before applying.
apiVersion: v1
kind: ConfigMap
metadata:
  name: kvwatch-rules
  namespace: monitoring
  labels:
    app.kubernetes.io/name: kvwatch
data:
"""


def render(rules_dir: Path = RULES_DIR) -> str:
    """The ConfigMap text: one data key per rule file, contents verbatim (block scalar)."""
    out = [HEADER]
    for f in sorted(rules_dir.glob("*.y*ml")):
        out.append(f"  {f.name}: |\n")
        for line in f.read_text(encoding="utf-8").splitlines():
            out.append(f"    {line}\n" if line.strip() else "\n")
    return "".join(out)


def main() -> int:
    target = HERE / "rules.yaml"
    target.write_text(render(), encoding="utf-8")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
