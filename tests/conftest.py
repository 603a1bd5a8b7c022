"""Shared test setup: offline, CPU engine settings, tiny models in a content-addressed cache."""

from __future__ import annotations

import os

from dspark_lab.engine_run import engine_env

for _key, _value in engine_env().items():
    os.environ.setdefault(_key, _value)
