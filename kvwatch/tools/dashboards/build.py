"""Render every generated artifact (dashboards JSON, recording rules YAML) and write or check them.

Output is deterministic (sorted JSON keys, fixed rule order), so regenerating
is byte-identical and a test can compare the checked-in files with memory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from kvwatch.tools.dashboards import enginedoc, fleet, instance, selfmon
from kvwatch.tools.dashboards.grafana import Dashboard
from kvwatch.tools.dashboards.recording import HEADER, recording_rule_file

#: Repository-relative output path → builder.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "dashboards/kvwatch-fleet.json": fleet.build,
    "dashboards/kvwatch-instance.json": instance.build,
    "dashboards/kvwatch-self.json": selfmon.build,
}
RECORDING_RULES = "rules/prometheus/kvwatch-recording.yaml"


def dashboard_json(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def rules_yaml(data: dict[str, Any]) -> str:
    # width: never fold long PromQL; sort_keys=False keeps record/expr/labels order
    return HEADER + yaml.safe_dump(data, sort_keys=False, width=10**6, allow_unicode=True)


def render_all(root: Path | None = None) -> dict[str, str]:
    """Every generated file's repository-relative path → its exact text.

    docs/engines.md is only partly generated: its dialect table is spliced into the
    file found under ``root`` (the prose around it is kept).
    """
    out = {path: dashboard_json(build().render()) for path, build in DASHBOARDS.items()}
    out[RECORDING_RULES] = rules_yaml(recording_rule_file())
    if root is not None:
        doc = root / enginedoc.DOC
        out[enginedoc.DOC] = enginedoc.splice(doc.read_text(encoding="utf-8") if doc.exists() else "# Engines\n")
    return out


def write_all(root: Path) -> list[Path]:
    """(Re)write the generated files under ``root``; returns the files whose content changed."""
    changed: list[Path] = []
    for rel, text in render_all(root).items():
        path = root / rel
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(path)
    return changed


def stale_files(root: Path) -> list[str]:
    """Generated files under ``root`` that differ from what the code renders now."""
    out = []
    for rel, text in render_all(root).items():
        path = root / rel
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            out.append(rel)
    return out
