"""vLLM adapters: the plugin entry point, the one builder, markers, metrics and the patches.

Every module here talks to vLLM; the logic it feeds lives in ``dspark_dynamic.core``.
"""
