"""A small typed model of the Grafana dashboard JSON that kvwatch emits (schemaVersion 39).

Panels are frozen dataclasses rendered to plain dicts; layout (``gridPos``)
and ids are assigned when a dashboard is rendered, in declaration order, so
the output is deterministic. Every Prometheus reference uses the
``${datasource}`` template variable; the importer's ``DS_PROMETHEUS`` input
seeds that variable, so the same JSON works imported and file-provisioned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

SCHEMA_VERSION = 39
DS_INPUT = "DS_PROMETHEUS"
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


class PanelType(StrEnum):
    TIMESERIES = "timeseries"
    HEATMAP = "heatmap"
    TABLE = "table"
    STAT = "stat"
    TEXT = "text"
    ROW = "row"


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel. ``instant`` targets feed tables and stats."""

    expr: str
    legend: str = "{{instance}}"
    instant: bool = False
    fmt: str = "time_series"

    def render(self, ref_id: str) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": self.expr,
            "format": self.fmt,
            "instant": self.instant,
            "legendFormat": self.legend,
            "range": not self.instant,
            "refId": ref_id,
        }


@dataclass(frozen=True)
class Panel:
    """A panel; ``description`` must say how to read it (tested)."""

    title: str
    type: PanelType
    description: str = ""
    targets: tuple[Target, ...] = ()
    unit: str = "short"
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    thresholds: tuple[tuple[float, str], ...] = ()
    content: str = ""  # markdown of text panels
    stack: bool = False
    overrides: tuple[dict[str, Any], ...] = ()
    data_links: tuple[dict[str, str], ...] = ()

    def render(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": panel_id,
            "type": str(self.type),
            "title": self.title,
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
        }
        if self.type is PanelType.ROW:
            out.update(collapsed=False, panels=[])
            return out
        out["description"] = self.description
        if self.type is PanelType.TEXT:
            out["options"] = {"mode": "markdown", "content": self.content}
            return out
        out["datasource"] = DATASOURCE
        out["targets"] = [t.render(chr(ord("A") + i)) for i, t in enumerate(self.targets)]
        out["fieldConfig"] = {"defaults": self._defaults(), "overrides": list(self.overrides)}
        out["options"] = self._options()
        if self.type is PanelType.TABLE:
            out["transformations"] = [{"id": "merge", "options": {}}]
        return out

    def _defaults(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
        steps += [{"color": color, "value": value} for value, color in self.thresholds]
        d: dict[str, Any] = {"unit": self.unit, "thresholds": {"mode": "absolute", "steps": steps}}
        if self.min is not None:
            d["min"] = self.min
        if self.max is not None:
            d["max"] = self.max
        if self.data_links:
            d["links"] = [dict(link) for link in self.data_links]
        if self.type is PanelType.TIMESERIES:
            d["custom"] = {
                "drawStyle": "line",
                "fillOpacity": 10 if not self.stack else 60,
                "lineWidth": 1,
                "showPoints": "never",
                "spanNulls": False,
                "stacking": {"group": "A", "mode": "normal" if self.stack else "none"},
                "thresholdsStyle": {"mode": "line" if self.thresholds else "off"},
            }
        return d

    def _options(self) -> dict[str, Any]:
        if self.type is PanelType.TIMESERIES:
            return {
                "legend": {"calcs": ["mean", "max"], "displayMode": "table", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        if self.type is PanelType.HEATMAP:
            return {
                "calculate": False,
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                "legend": {"show": True},
                "tooltip": {"mode": "single", "yHistogram": True},
                "yAxis": {"axisPlacement": "left", "unit": self.unit},
                "rowsFrame": {"layout": "auto"},
            }
        if self.type is PanelType.STAT:
            return {
                "colorMode": "background",
                "graphMode": "none",
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "textMode": "value_and_name",
            }
        return {"showHeader": True, "cellHeight": "sm"}


def row(title: str) -> Panel:
    return Panel(title, PanelType.ROW, width=GRID_WIDTH, height=1)


@dataclass(frozen=True)
class Variable:
    """A template variable; ``query`` is a Prometheus variable query (``label_values(...)``)."""

    name: str
    label: str
    query: str = ""
    kind: str = "query"
    include_all: bool = True
    multi: bool = True
    hide: int = 0
    all_value: str | None = None  # None: "All" expands to the listed values

    def render(self) -> dict[str, Any]:
        if self.kind == "datasource":
            return {
                "current": {"selected": False, "text": "${" + DS_INPUT + "}", "value": "${" + DS_INPUT + "}"},
                "hide": self.hide,
                "includeAll": False,
                "label": self.label,
                "multi": False,
                "name": self.name,
                "options": [],
                "query": "prometheus",
                "refresh": 1,
                "regex": "",
                "type": "datasource",
            }
        if self.include_all:
            current: dict[str, Any] = {"selected": True, "text": ["All"], "value": ["$__all"]}
        else:
            current = {}
        out: dict[str, Any] = {
            "current": current,
            "datasource": DATASOURCE,
            "definition": self.query,
            "hide": self.hide,
            "includeAll": self.include_all,
            "label": self.label,
            "multi": self.multi,
            "name": self.name,
            "options": [],
            "query": {"qryType": 1, "query": self.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "regex": "",
            "sort": 1,
            "type": "query",
        }
        if self.all_value is not None:
            out["allValue"] = self.all_value
        return out


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    variables: tuple[Variable, ...]
    annotations: tuple[dict[str, Any], ...] = ()
    tags: tuple[str, ...] = ("kvwatch",)
    links: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    time_from: str = "now-3h"

    def render(self) -> dict[str, Any]:
        return {
            "__inputs": [
                {
                    "name": DS_INPUT,
                    "label": "Prometheus",
                    "description": "Prometheus that scrapes the engines (and kvwatch) and loads kvwatch's recording rules",
                    "type": "datasource",
                    "pluginId": "prometheus",
                    "pluginName": "Prometheus",
                }
            ],
            "__requires": [
                {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
                {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
                *[
                    {"type": "panel", "id": t, "name": t, "version": ""}
                    for t in sorted({str(p.type) for p in self.panels} - {"row"})
                ],
            ],
            "annotations": {"list": list(self.annotations)},
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,
            "links": list(self.links),
            "panels": _layout(self.panels),
            "refresh": "1m",
            "schemaVersion": SCHEMA_VERSION,
            "tags": list(self.tags),
            "templating": {"list": [v.render() for v in self.variables]},
            "time": {"from": self.time_from, "to": "now"},
            "timepicker": {},
            "timezone": "",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
            "weekStart": "",
        }


def _layout(panels: tuple[Panel, ...]) -> list[dict[str, Any]]:
    """Flow panels left to right into 24-column rows; a row panel starts a new line."""
    out: list[dict[str, Any]] = []
    x = y = line_h = 0
    for i, p in enumerate(panels, start=1):
        if p.type is PanelType.ROW or x + p.width > GRID_WIDTH:
            y, x, line_h = y + line_h, 0, 0
        out.append(p.render(i, x, y))
        x += p.width
        line_h = max(line_h, p.height)
        if p.type is PanelType.ROW:
            y, x, line_h = y + p.height, 0, 0
    return out
