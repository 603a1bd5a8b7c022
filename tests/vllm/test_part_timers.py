"""The benchmark's part timers name methods of the installed vLLM (a rename drops a part silently)."""

import pytest

pytest.importorskip("vllm")

from dspark_lab import part_timers  # noqa: E402


def test_every_part_of_a_step_is_found_in_the_installed_vllm():
    assert part_timers.missing() == []


def test_the_hooks_are_each_patched_part_less_its_time_under_the_patch():
    totals = {"schedule": 3.0, "schedule (vLLM)": 2.5, "execute model": 7.0, "execute model (vLLM)": 6.75,
              "update from output": 1.0, "model forward": 9.0}  # no timing under the update's patch
    assert part_timers.hooks(totals) == 0.75
    assert part_timers.hook_times(totals) == {"schedule": 0.5, "execute model": 0.25}
