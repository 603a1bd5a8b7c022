"""Smoke form of scripts/bench_controller.py: every marker set runs, and its phases really flip."""

import importlib.util
from pathlib import Path

import pytest

from dspark_dynamic.core.phase import Phase, RequestPhase
from dspark_dynamic.core.policy import BatchDepth

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_controller.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_controller", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("markers", ["single", "harmony", "harmony-noisy"])
def test_marker_sets_run_and_flip(bench, markers):
    rules, opens, closes, _ = bench.MARKER_SETS[markers]
    state = RequestPhase(rules, [1, 2, *opens])
    assert state.phase is Phase.REASONING
    if len(closes) > 1:
        assert state.advance(rules, [3, *closes[:1]]) is Phase.REASONING  # split: not yet
    assert state.advance(rules, [3, *closes, 4]) is Phase.ANSWER
    assert bench.bench_steps(4, 60, BatchDepth.PER_REQUEST, "phase", markers) > 0
    assert bench.bench_steps(4, 60, BatchDepth.PER_REQUEST, "adaptive+confidence", markers) > 0
    assert bench.bench_prompt_scan(10_000, 9_999, markers) >= 0


def test_lines_per_request_step_count_the_controller_and_grow_with_the_policy(bench):
    """The machine-independent cost: the adaptive policy runs more lines than the phase policy,
    and nothing is counted outside the controller's calls (the harness's own work is not)."""
    phase = bench.count_lines(2, 100, "phase")
    adaptive = bench.count_lines(2, 100, "adaptive")
    assert 10 < phase < adaptive
    estimated = bench.count_lines(2, 100, "phase+estimate")  # the live estimate is opt-in: phase alone is as cheap
    assert phase < estimated < adaptive
    assert bench.bench_reference(repeats=1) > 0
