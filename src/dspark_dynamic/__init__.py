"""dspark_dynamic: phase-aware speculative-decoding depth for vLLM."""

from dspark_dynamic.adapter.plugin import register

__all__ = ["register"]
__version__ = "0.1.0"
