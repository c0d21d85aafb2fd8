"""Shards: N kvwatch replicas split the fleet so that each target is evaluated exactly once.

A target belongs to shard ``hashmod(job;instance) % count``, computed the way
Prometheus' ``hashmod`` relabel action does (MD5 of the source label values
joined by ``;``, the low 8 bytes read as a big-endian integer, modulo N). So a
relabel rule ``source_labels: [job, instance], modulus: N, action: hashmod`` in
Prometheus puts every target in the same shard as kvwatch does, and the split is
stable across restarts and replicas (no coordination needed).

``by: group`` hashes ``job;model`` instead: every replica of one model lands in
the same shard, so replica-imbalance facts (computed per ``(job, model)``) see
the whole group. The default ``target`` spreads load most evenly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from kvwatch.core.models import Target

ShardBy = Literal["target", "group"]


def hashmod(values: Iterable[str], modulus: int) -> int:
    """Prometheus' ``hashmod`` of label values joined by ``;`` (the relabel default separator)."""
    digest = hashlib.md5(";".join(values).encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0 ≤ index < count). ``count == 1`` owns everything."""

    index: int = 0
    count: int = 1
    by: ShardBy = "target"

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"shard {self.index}/{self.count}: expected 0 <= index < count")

    @property
    def active(self) -> bool:
        return self.count > 1

    def of(self, target: Target) -> int:
        """The shard index ``target`` belongs to."""
        values = (target.key.job, target.model) if self.by == "group" else (target.key.job, target.key.instance)
        return hashmod(values, self.count)

    def owns(self, target: Target) -> bool:
        return not self.active or self.of(target) == self.index

    def select(self, targets: Iterable[Target]) -> list[Target]:
        """This shard's targets, in the given order."""
        return [t for t in targets if self.owns(t)]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}" + ("" if self.by == "target" else f" by {self.by}")


def parse_shard(text: str) -> Shard:
    """``"I/N"`` → :class:`Shard`; raises ValueError with the expected form."""
    idx, sep, cnt = text.strip().partition("/")
    if not sep or not idx.isdigit() or not cnt.isdigit():
        raise ValueError(f"got {text!r}, expected I/N with 0 <= I < N, e.g. 0/2")
    try:
        return Shard(int(idx), int(cnt))
    except ValueError:
        raise ValueError(f"got {text!r}, expected I/N with 0 <= I < N, e.g. 0/2") from None
