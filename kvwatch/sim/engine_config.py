"""Configuration of one simulated engine instance (capacity, limits, policy, speed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    """Capacity, limits, scheduling policy and speed of one engine instance."""

    num_blocks: int = 16_384
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192  # token budget of one engine iteration
    max_model_len: int = 32_768
    prefill_tokens_per_s: float = 20_000.0
    decode_step_s: float = 0.02  # decode iteration time of an empty batch, s
    batch_knee: float = 128.0  # running count at which the iteration time doubles
    max_prefill_share: float = 0.6  # max share of a step spent on prefill while decoding
    watermark_frac: float = 0.0  # fraction of blocks kept free at admission
    reserve_max_output: bool = False  # admit against prompt + max_tokens blocks
    client_timeout_s: float = 600.0  # clients abort after this long (0: never), s
    stalled: bool = False  # scheduler wedged: nothing is scheduled or computed
    compute_factor: float = 1.0  # >1 slows prefill and decode (compute/CPU-bound)
    dt: float = 1.0  # step length, s

    def __post_init__(self) -> None:
        if self.num_blocks * self.block_size < self.max_model_len:
            raise ValueError("KV pool smaller than max_model_len")
        if self.max_num_seqs < 1 or self.dt <= 0 or self.compute_factor <= 0:
            raise ValueError("max_num_seqs must be >= 1, dt and compute_factor > 0")

    @property
    def kv_tokens(self) -> int:
        return self.num_blocks * self.block_size
