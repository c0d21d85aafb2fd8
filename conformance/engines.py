"""The engine versions the harness drives, and their variants.

``sim_dialect`` names the simulator's hand-written dialect that the same timeline is
compared against; ``dialects`` the kvwatch dialect-table entries that read the fixtures
(their fingerprint goes into every fixture header). ``pip`` is what the venv installs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Variant:
    """One way of running an engine's exporter: name suffix and driver options."""

    name: str  # "" for the default
    options: dict[str, object] = field(default_factory=dict)
    data_parallel: int = 1  # simulated engines behind the one /metrics endpoint


@dataclass(frozen=True)
class EngineVersion:
    engine: str  # vllm | sglang
    version: str
    pip: tuple[str, ...]
    driver: str  # file name under conformance/drivers/
    sim_dialect: str
    dialects: tuple[str, ...]
    variants: tuple[Variant, ...] = (Variant(""),)

    @property
    def key(self) -> str:
        return f"{self.engine}-{self.version}"


ENGINES: tuple[EngineVersion, ...] = (
    EngineVersion("vllm", "0.33.0", ("vllm==0.33.0",), "vllm_v1.py", "vllm-0.33", ("vllm-v1",),
                  (Variant(""), Variant("dp2", {}, data_parallel=2))),
    EngineVersion("vllm", "0.8.5.post1", ("vllm==0.8.5.post1",), "vllm_v1.py", "vllm-0.8.2",
                  ("vllm-v1",)),
    EngineVersion("sglang", "0.5.23", ("sglang==0.5.23",), "sglang_v05.py", "sglang-0.5",
                  ("sglang",),
                  (Variant(""), Variant("tp2", {"tp_size": 2}),
                   Variant("priority", {"priority": True}))),
    # the package alone: its collector module is loaded by path (no torch, no kernels)
    EngineVersion("sglang", "0.4.10.post2", ("sglang==0.4.10.post2", "prometheus-client"),
                  "sglang_v04.py", "sglang-0.5", ("sglang",)),
)
BY_KEY = {e.key: e for e in ENGINES}

#: simulator presets used for the time series: fixture scenario name → preset
SCENARIOS: dict[str, str] = {"healthy": "healthy-busy", "full": "full"}
