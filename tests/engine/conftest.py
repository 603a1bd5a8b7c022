"""Run real vLLM engines (CPU, tiny models) in subprocesses and share their reports."""

from __future__ import annotations

from typing import Any

import pytest

from dspark_lab import tiny_models
from dspark_lab.engine_run import run_in_subprocess
from dspark_lab.scenarios import SCRIPT

pytest.importorskip("vllm")


@pytest.fixture(scope="session")
def target() -> str:
    return str(tiny_models.build_target(SCRIPT))


@pytest.fixture(scope="session")
def phase_draft() -> str:
    return str(tiny_models.build_phase_draft(SCRIPT))


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    """engine(name, spec) -> report; each distinct name runs once per session."""
    cache: dict[str, dict[str, Any]] = {}

    def get(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        if name not in cache:
            cache[name] = run_in_subprocess(spec, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


def counters_delta(report: dict[str, Any], batch: int) -> dict[str, float]:
    """vLLM's spec-decode counters for one batch (reports are cumulative)."""
    now = report["batches"][batch]["vllm"]
    before = report["batches"][batch - 1]["vllm"] if batch else None
    keys = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    return {k.split("num_")[-1]: now[k] - (before[k] if before else 0) for k in keys}
