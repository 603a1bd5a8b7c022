"""Pure logic: phase detection, depth policies, the controller, statistics, options.

Nothing under ``dspark_dynamic.core`` imports vLLM or torch (a test enforces it), so all of it
is unit-tested in milliseconds and reads without a vLLM checkout beside it.
"""
