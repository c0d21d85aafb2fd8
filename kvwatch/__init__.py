"""kvwatch: tell KV-cache failure modes of LLM inference engines apart, from Prometheus."""

from __future__ import annotations

__version__ = "0.1.0"
