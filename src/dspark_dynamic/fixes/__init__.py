"""Start-up fixes for bugs in vLLM's dependencies, applied from ``register()``."""
