"""Closed vocabularies of the simulator: failure modes, idle causes, dialect ids."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """Primary failure mode a scenario is expected to show (see failure-modes.md)."""

    HEALTHY = "healthy"
    FULL = "full"
    IDLE = "idle"
    FRAGMENTED = "fragmented"
    OSCILLATING = "oscillating"
    MISREAD = "misread"


class IdleCause(StrEnum):
    """Sub-cause of the idle mode."""

    LOW_DEMAND = "low_demand"
    BATCH_LIMITED = "batch_limited"
    STALLED = "stalled"
    COMPUTE_BOUND = "compute_bound"


class Dialect(StrEnum):
    """Metric dialect of an engine/version (ids are a contract)."""

    VLLM_0_33 = "vllm-0.33"
    VLLM_0_10 = "vllm-0.10"
    VLLM_0_8_2 = "vllm-0.8.2"
    VLLM_V0_0_6 = "vllm-v0-0.6"
    SGLANG_0_5 = "sglang-0.5"
    SGLANG_0_4_0 = "sglang-0.4.0"
    SGLANG_RAY = "sglang-ray"
    VLLM_RAY = "vllm-ray"
    LMDEPLOY = "lmdeploy"
    TGI = "tgi"
    DYNAMO_FRONTEND = "dynamo-frontend"
    DYNAMO_WORKER = "dynamo-worker"
    TRTLLM_TRITON = "trtllm-triton"
    TRTLLM_SERVE = "trtllm-serve"
    TRTLLM_SERVE_GEN_A = "trtllm-serve-genA"

    @property
    def engine(self) -> str:
        """Engine family: ``vllm``, ``sglang``, ``trtllm``, ``lmdeploy``, ``tgi`` or ``dynamo``."""
        return self.value.split("-", 1)[0]


#: Precedence of modes when several signatures match (failure-modes.md).
PRECEDENCE: tuple[Mode, ...] = (
    Mode.FULL,
    Mode.OSCILLATING,
    Mode.FRAGMENTED,
    Mode.MISREAD,
    Mode.IDLE,
    Mode.HEALTHY,
)
