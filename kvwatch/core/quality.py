"""Classification quality on a labelled corpus: confusion matrix, per-mode precision/recall/F1.

Pure functions over (expected, predicted) label pairs, used by the corpus tests
and ``benchmarks/classify.py``. ``unknown`` predictions count as misses of the
expected mode (a blind spot is not a correct diagnosis) but never as a false
alarm of another mode.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from kvwatch.core.dialects import DIALECTS, selector
from kvwatch.core.promclient import QueryClient
from kvwatch.core.signals import Signal

MODES: tuple[str, ...] = ("healthy", "full", "idle", "fragmented", "oscillating", "misread")


@dataclass(frozen=True)
class ModeScore:
    mode: str
    support: int
    predicted: int
    true_positives: int

    @property
    def precision(self) -> float:
        return self.true_positives / self.predicted if self.predicted else (1.0 if not self.support else 0.0)

    @property
    def recall(self) -> float:
        return self.true_positives / self.support if self.support else 1.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


@dataclass(frozen=True)
class Report:
    scores: tuple[ModeScore, ...]
    confusion: dict[tuple[str, str], int]
    total: int
    healthy_false_alarms: int

    @property
    def macro_f1(self) -> float:
        present = [s for s in self.scores if s.support]
        return sum(s.f1 for s in present) / len(present) if present else 0.0

    @property
    def accuracy(self) -> float:
        ok = sum(n for (e, p), n in self.confusion.items() if e == p)
        return ok / self.total if self.total else 0.0

    def table(self) -> str:
        """Per-mode precision/recall/F1 and the confusion matrix as aligned text."""
        preds = list(MODES) + sorted({p for _, p in self.confusion} - set(MODES))
        lines = [f"{'mode':<12} {'support':>7} {'precision':>9} {'recall':>7} {'f1':>6}"]
        for s in self.scores:
            lines.append(f"{s.mode:<12} {s.support:>7} {s.precision:>9.3f} {s.recall:>7.3f} {s.f1:>6.3f}")
        lines.append(f"{'macro-F1':<12} {self.total:>7} {'':>9} {'':>7} {self.macro_f1:>6.3f}")
        lines.append("")
        lines.append("confusion (rows expected, columns predicted):")
        lines.append(" " * 12 + "".join(f"{p[:10]:>11}" for p in preds))
        for e in MODES:
            row = [self.confusion.get((e, p), 0) for p in preds]
            if any(row):
                lines.append(f"{e:<12}" + "".join(f"{n:>11}" for n in row))
        return "\n".join(lines)


def score(pairs: Iterable[tuple[str, str]], modes: Sequence[str] = MODES) -> Report:
    """Score (expected, predicted) pairs. Predictions outside ``modes`` (e.g. unknown) are misses."""
    pairs = list(pairs)
    confusion = Counter(pairs)
    scores = []
    for m in modes:
        support = sum(1 for e, _ in pairs if e == m)
        predicted = sum(1 for _, p in pairs if p == m)
        tp = confusion.get((m, m), 0)
        scores.append(ModeScore(m, support, predicted, tp))
    false_alarms = sum(n for (e, p), n in confusion.items() if e == "healthy" and p not in ("healthy",))
    return Report(tuple(scores), dict(confusion), len(pairs), false_alarms)


def static_baseline(client: QueryClient, at: datetime, threshold: float = 0.9, over: str = "5m") -> set[str]:
    """Instances the usual static alert ``min_over_time(kv_usage[5m]) > 0.9`` fires for at ``at``.

    One query per KV-usage metric name of every dialect (the baseline knows the names;
    it just has one signal and one threshold).
    """
    return {inst for _, inst in static_baseline_targets(client, at, threshold, over)}


def static_baseline_targets(client: QueryClient, at: datetime, threshold: float = 0.9, over: str = "5m"
                            ) -> set[tuple[str, str]]:
    """(job, instance) pairs the static alert fires for at ``at`` (see :func:`static_baseline`)."""
    fired: set[tuple[str, str]] = set()
    for sel in kv_usage_selectors():
        q = f"{static_alert_expr(sel, over)} > {threshold}"
        fired |= {(row["metric"].get("job", ""), row["metric"]["instance"]) for row in client.instant(q, at)
                  if "instance" in row.get("metric", {})}
    return fired


def kv_usage_selectors() -> list[str]:
    """Every distinct KV-usage selector of the dialect table, in table order: what the static alert watches."""
    out: list[str] = []
    for d in DIALECTS:
        for src in d.sources.get(Signal.KV_USAGE, ()):
            sel = selector(src.metric, src.matchers)
            if sel not in out:
                out.append(sel)
    return out


def static_alert_expr(sel: str, over: str = "5m") -> str:
    """The static alert's value per (job, instance) before its threshold: the lowest KV usage
    (0-1) of ``sel`` over the last ``over``, the highest over a target's series."""
    return f"max by (job, instance) (min_over_time({sel}[{over}]))"
