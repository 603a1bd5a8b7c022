"""Adapters: every vLLM internal the plugin touches, one module per patched behaviour.

Each ``Patch`` carries its own row of the patch table (target, process, why, where it lives in
the fork / vLLM 0.32 / vLLM 0.33, when it can go).  The table is printed from the registered
patches, never written by hand::

    python -m dspark_dynamic.adapter.patches.check --table   # Markdown; docs/patches.md holds it

Rules every adapter follows: it names its target and expected parameters; it is applied when its
module is imported and is a no-op unless ``additional_config`` holds ``dspark_dynamic``; a
missing target is an error only when the feature is requested (the config adapter forces the
scheduler patches in with ``strict=True``, and the CUDA-graph patch for Model Runner V2 methods).
"""
