"""KV-cache geometry of a model: what one cached token costs.

:class:`ModelGeometry` holds ``kv_factor × layers × kv_heads × head_dim``
elements per token and the KV element type (:class:`KVDtype`). It is built
from flags or from a Hugging Face ``config.json`` by
:mod:`kvwatch.tools.capacity.hfconfig` (flags override config values). Units:
``head_dim`` in elements, sizes in bytes.

MLA models (DeepSeek) cache one shared latent of ``kv_lora_rank +
qk_rope_head_dim`` elements per token per layer: ``kv_factor=1``,
``kv_heads=1``, ``head_dim=<latent width>``. A sliding window is recorded for
notes only; capacity figures stay the full-attention worst case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from kvwatch.tools.capacity.units import CapacityError


class KVDtype(StrEnum):
    """Element type of the KV cache; the value is the CLI spelling."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bytes_per_element(self) -> Fraction:
        """Bytes per element, exact (``int4`` is 1/2: two elements packed per byte)."""
        return _BYTES[self]

    @classmethod
    def parse(cls, text: str, field: str = "--kv-dtype") -> KVDtype:
        """``bf16`` … ``int4`` (case-insensitive) or raise a one-line :class:`CapacityError`."""
        try:
            return cls(str(text).strip().lower())
        except ValueError:
            names = ", ".join(d.value for d in cls)
            raise CapacityError(
                f"{field}: unknown dtype {text!r} (expected one of {names})"
            ) from None


_BYTES: dict[KVDtype, Fraction] = {
    KVDtype.BF16: Fraction(2),
    KVDtype.FP16: Fraction(2),
    KVDtype.FP8: Fraction(1),
    KVDtype.INT8: Fraction(1),
    KVDtype.INT4: Fraction(1, 2),
}


@dataclass(frozen=True)
class ModelGeometry:
    """KV geometry: ``kv_factor × layers × kv_heads × head_dim`` elements per token.

    ``kv_factor`` is 2 (separate K and V) or 1 (MLA's shared latent).
    ``sliding_window`` (tokens) and ``sliding_layers`` only feed notes;
    ``max_context`` (tokens, ``max_position_embeddings``) is the default worst case.
    """

    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: KVDtype = KVDtype.BF16
    kv_factor: int = 2
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    sliding_window: int | None = None
    sliding_layers: int | None = None
    max_context: int | None = None
    source: str = "flags"
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise CapacityError(
                    f"--{name.replace('_', '-')}: must be a whole number > 0, got {value!r}"
                )
        if self.kv_factor not in (1, 2):
            raise CapacityError(
                f"kv_factor: must be 1 (MLA) or 2 (K and V), got {self.kv_factor!r}"
            )

    @property
    def is_mla(self) -> bool:
        return self.kv_factor == 1

    @property
    def elements_per_token(self) -> int:
        """KV elements one token occupies over all layers."""
        return self.kv_factor * self.layers * self.kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready geometry (integers; ``bytes_per_element`` may be 0.5 for int4)."""
        bpe = self.kv_dtype.bytes_per_element
        return {
            "source": self.source,
            "layers": self.layers,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "kv_dtype": self.kv_dtype.value,
            "bytes_per_element": int(bpe) if bpe.denominator == 1 else float(bpe),
            "kv_factor": self.kv_factor,
            "attention": "mla" if self.is_mla else "mha/gqa/mqa",
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "sliding_window": self.sliding_window,
            "sliding_layers": self.sliding_layers,
            "max_context": self.max_context,
        }
