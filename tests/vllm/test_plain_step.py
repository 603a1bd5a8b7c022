"""A step that verifies and drafts nothing runs the runner's plain branches: the wrappers around
the installed vLLM's ``_prepare_inputs``, ``execute_model`` and ``sample_tokens``, on a runner
whose vLLM methods are recorded (the real engine runs in tests/engine/test_drafter_skip_engine.py)."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm")

from dspark_dynamic.adapter.patches import plain_step  # noqa: E402
from dspark_dynamic.adapter.patches.drafter_skip import ATTR as SKIP_ATTR  # noqa: E402
from dspark_dynamic.adapter.patches.drafter_skip import DrafterSkip  # noqa: E402
from dspark_dynamic.adapter.patches.plain_step import ATTR, GUARD, PATCHES, SAVED  # noqa: E402
from dspark_dynamic.core.drafter_lag import DrafterLag  # noqa: E402

SPEC = object()  # the runner's speculative config


class Runner:
    """What the wrappers read of a Model Runner V1, and vLLM's three methods, recorded."""

    def __init__(self, starts=(40, 7), hybrid=False, skip=True, max_lag=256):
        self.speculative_config = SPEC
        self.model_config = SimpleNamespace(is_hybrid=hybrid)
        self.input_batch = SimpleNamespace(num_reqs=len(starts), req_ids=[f"r{i}" for i in range(len(starts))],
                                           num_computed_tokens_cpu=np.array(starts, dtype=np.int32))
        self.requests = {r: None for r in self.input_batch.req_ids}
        self.drafter = SimpleNamespace()
        self.drafter.__dict__[SKIP_ATTR] = DrafterSkip(self, DrafterLag(max_lag), buffer=1024, per_row=3) if skip else None
        self.seen = []  # the speculative config each vLLM method ran with

    def vllm_prepare(self, scheduler_output, num_scheduled_tokens):
        self.seen.append(("prepare", self.speculative_config))
        return "inputs"

    def vllm_execute(self, scheduler_output, intermediate_tensors=None):
        self.seen.append(("execute", self.speculative_config))
        if scheduler_output == "fail":
            raise RuntimeError("vLLM's own error")
        return scheduler_output if scheduler_output == "output" else None

    def vllm_sample(self, grammar_output):
        self.seen.append(("sample", self.speculative_config))
        return "tokens"


prepare = PATCHES[0].build(Runner.vllm_prepare)
execute = PATCHES[1].build(Runner.vllm_execute)
sample = PATCHES[2].build(Runner.vllm_sample)


def idle(k=0, drafts=None):
    return SimpleNamespace(scheduled_spec_decode_tokens=drafts or {}, num_spec_tokens_to_schedule=k)


def step(runner, scheduler_output, queries=(1, 1)):
    """One engine step as vLLM runs it: execute_model (which prepares the inputs), then sample_tokens."""
    def vllm_execute(self, out, intermediate_tensors=None):
        prepare(self, out, np.array(queries, dtype=np.int32))
        return Runner.vllm_execute(self, out)

    result = PATCHES[1].build(vllm_execute)(runner, scheduler_output)
    return sample(runner, None) if result is None else result


def test_the_patches_target_the_installed_runner():
    assert [p.problem() for p in PATCHES] == [None, None, None]


def test_an_idle_step_runs_with_the_speculative_config_off_and_gets_it_back():
    runner = Runner()
    assert step(runner, idle()) == "tokens"
    assert runner.seen == [("prepare", None), ("execute", None), ("sample", None)]
    assert runner.speculative_config is SPEC and SAVED not in runner.__dict__
    lag = runner.drafter.__dict__[SKIP_ATTR].lag
    assert lag.skipped_steps == 1 and len(lag) == 2  # the drafter's idle positions are recorded, as its own skip does
    assert runner.__dict__[ATTR] is True


@pytest.mark.parametrize("scheduler_output", [idle(k=2), idle(drafts={"r0": [5, 6]})])
def test_a_step_that_verifies_or_drafts_keeps_the_speculative_path(scheduler_output):
    runner = Runner()
    step(runner, scheduler_output)
    assert [config for _name, config in runner.seen] == [SPEC, SPEC, SPEC]
    assert runner.drafter.__dict__[SKIP_ATTR].lag.skipped_steps == 0


def test_a_drafter_that_must_catch_up_or_is_not_skipped_keeps_the_speculative_path():
    far = Runner(max_lag=4)
    step(far, idle(), queries=(1, 1))  # r0 and r1 would lag 1: allowed
    far.seen.clear()
    step(far, idle(), queries=(5, 1))  # r0 would lag 6 > 4: the drafter must run
    assert [config for _name, config in far.seen] == [SPEC, SPEC, SPEC]
    for runner, why in ((Runner(skip=False), "idle forward is not skipped"), (Runner(hybrid=True), "hybrid")):
        step(runner, idle())
        assert [config for _name, config in runner.seen] == [SPEC, SPEC, SPEC]
        assert runner.__dict__[ATTR] is None and why in plain_step.why_not_plain(runner)


def test_an_engine_the_plugin_does_not_drive_decides_once_and_says_nothing(caplog):
    # the fake runner has no vLLM config: the plugin is not configured for it (a configured one
    # without the skip says why: tests/engine/test_drafter_skip_engine.py)
    for runner in (Runner(skip=False), Runner()):  # no idle-drafter skip attached; one attached
        with caplog.at_level(logging.INFO, logger="vllm.dspark_dynamic"):
            step(runner, idle())
            step(runner, idle())
        said = [r.getMessage() for r in caplog.records if r.name == "vllm.dspark_dynamic"]
        caplog.clear()
        if runner.drafter.__dict__[SKIP_ATTR] is None:
            assert said == [] and runner.__dict__[ATTR] is None
        else:
            assert said == ["dspark_dynamic: steps that verify and draft nothing run vLLM's plain decoding path"]


def test_the_config_comes_back_when_execute_model_returns_output_or_raises():
    runner = Runner()
    assert step(runner, SimpleNamespace(**vars(idle()))) == "tokens"
    for out in ("output", "fail"):
        scheduler_output = SimpleNamespace(**vars(idle()))
        runner.seen.clear()

        def vllm_execute(self, _out, intermediate_tensors=None, result=out):
            prepare(self, scheduler_output, np.array([1, 1], dtype=np.int32))
            return Runner.vllm_execute(self, result)

        wrapped = PATCHES[1].build(vllm_execute)
        if out == "fail":
            with pytest.raises(RuntimeError, match="vLLM's own error"):
                wrapped(runner, scheduler_output)
        else:
            assert wrapped(runner, scheduler_output) == "output"
        assert runner.seen == [("prepare", None), ("execute", None)]
        assert runner.speculative_config is SPEC and SAVED not in runner.__dict__


def test_a_step_left_plain_is_restored_before_the_next_one_prepares():
    runner = Runner()
    prepare(runner, idle(), np.array([1, 1], dtype=np.int32))  # no sample_tokens followed
    assert runner.speculative_config is None
    prepare(runner, idle(k=2), np.array([1, 1], dtype=np.int32))
    assert runner.seen[-1] == ("prepare", SPEC) and runner.speculative_config is SPEC


def test_a_fault_keeps_vllms_speculative_path_for_good():
    runner, before = Runner(), GUARD.errors
    del runner.input_batch.num_computed_tokens_cpu  # an unknown runner
    assert step(runner, idle()) == "tokens"
    assert [config for _name, config in runner.seen] == [SPEC, SPEC, SPEC]
    assert GUARD.errors == before + 1 and runner.__dict__[ATTR] is None
    runner.seen.clear()
    step(runner, idle())
    assert [config for _name, config in runner.seen] == [SPEC, SPEC, SPEC]
