"""The laboratory: test beds, tiny and fake models, fault injectors, the reference sampler, the
simulator and the benchmark harnesses.

It lives beside the plugin, never inside it: the ``dspark-dynamic`` wheel does not ship it
(``tests/vllm/test_wheel.py``), and no module of ``dspark_dynamic`` imports it.  The repo's tests
and scripts use it from development environments (``scripts/setup_env.sh`` installs it editable).
Models are built locally, never downloaded.
"""
