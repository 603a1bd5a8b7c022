"""Smoke form of scripts/simulate.py's dead-spot mode (the replays it prints are pure logic)."""

import importlib.util
from pathlib import Path

from dspark_lab.simulate import fresh_engine_drafting

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "simulate.py"


def test_dead_spots_print_one_row_per_noise_level_from_the_replays(capsys):
    spec = importlib.util.spec_from_file_location("simulate_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.print_dead_spots(2, steps=120, early=60)
    rows = capsys.readouterr().out.splitlines()[2:]
    assert len(rows) == 4
    quiet = [fresh_engine_drafting(seed, 120, 0.0, 60) for seed in range(2)]
    cols = rows[0].split()  # noise 0 %: the two replays' counts
    assert int(cols[1]) == sum(early >= 24 for early, _ in quiet)
    assert float(cols[2]) == round(sum(e for e, _ in quiet) / 2, 1)
    assert int(cols[4]) == max(a for _, a in quiet) > 0


def test_context_mode_prints_a_table_per_mix_and_the_ratio_to_the_oracle(capsys):
    spec = importlib.util.spec_from_file_location("simulate_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import sys

    argv, sys.argv = sys.argv, ["simulate.py", "--context", "--steps", "40", "--seeds", "1",
                                "--context-costs", "testbed"]
    try:
        module.main()
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    from dspark_lab.simulate_context import MIXES

    assert "3200.0 ns*sum ctx" in out and out.count("\n== ") == len(MIXES)
    summary = out.split("÷ oracle")[1].splitlines()[1:]
    assert [line.split("  ")[0].strip() for line in summary] == list(MIXES)
