"""Replica-group facts: each target's KV usage against the others of its (job, model) group."""

from __future__ import annotations

from collections import defaultdict

from kvwatch.core.diagnose.view import TargetView
from kvwatch.core.models import TargetKey

#: span over which group (replica) comparisons are made, seconds
GROUP_SPAN_S = 600.0


def group_facts(views: list[TargetView]) -> dict[TargetKey, dict[str, float | None]]:
    """Replica-imbalance facts: each target against the others of its (job, model) group."""
    groups: dict[tuple[str, str], list[tuple[TargetKey, float]]] = defaultdict(list)
    for v in views:
        mean = v.stat("kv_usage", GROUP_SPAN_S, "mean")
        if mean is not None and v.target.model:
            groups[v.target.group].append((v.key, mean))
    out: dict[TargetKey, dict[str, float | None]] = {}
    for members in groups.values():
        n = len(members)
        order = sorted(range(n), key=lambda i: members[i][1])
        srt = [members[i][1] for i in order]
        mean = sum(srt) / n
        for k, i in enumerate(order):  # k: this member's position in the sorted means
            key, mine = members[i]
            med = _median_without(srt, k) if n > 1 else None
            out[key] = {
                "group_size": float(n),
                "group_kv_usage_median": med,
                "group_kv_usage_mean": mean,
                "kv_usage_vs_group": None if med is None else mine - med,
            }
    return out


def _median_without(srt: list[float], k: int) -> float:
    """Median of sorted ``srt`` without its element ``k``, in O(1) (groups can be large)."""
    m = len(srt) - 1

    def at(j: int) -> float:
        return srt[j] if j < k else srt[j + 1]

    return (at((m - 1) // 2) + at(m // 2)) / 2
