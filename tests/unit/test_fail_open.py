"""The fail-open guard (adapter/fail_open.py) on stand-ins: what it catches, what it never does."""

import errno
import logging
import shutil

import pytest

from dspark_dynamic.adapter import fail_open, metrics
from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.stats import PhaseStats

ATTR = "_plugin"


class Owner:
    """A patched vLLM object: ``step`` is the original, recording its calls."""

    def __init__(self, fail_inside=None):
        self.calls = []
        self.fail_inside = fail_inside

    def step(self, x, *, y=0):
        self.calls.append((x, y))
        if self.fail_inside:
            self.fail_inside(self)
        return x + y


class Hook:
    def __init__(self):
        self.seen = []


def boom(*args, **kwargs):
    raise KeyError("a request shape this plugin did not expect")


def guarded(before=None, after=None, release=None):
    released = []
    guard = fail_open.FailOpen(ATTR, release or (lambda owner, hook: released.append(hook)))
    return guard, guard.wrap(Owner.step, before, after), released


def records(caplog):
    return [r for r in caplog.records if r.getMessage().startswith(fail_open.LOG_PREFIX)]


def test_a_fault_before_the_original_detaches_logs_once_and_vllm_runs(caplog):
    guard, step, released = guarded(before=boom, after=lambda *a: pytest.fail("after ran on a detached plugin"))
    owner, hook = Owner(), Hook()
    owner.__dict__[ATTR] = hook
    with caplog.at_level(logging.ERROR, logger="vllm.dspark_dynamic"):
        assert step(owner, 2, y=3) == 5
        assert step(owner, 1) == 1  # later calls: vLLM's own, the plugin is not called again
    assert owner.calls == [(2, 3), (1, 0)]  # the original ran exactly once per call
    assert owner.__dict__[ATTR] is None and guard.errors == 1 and released == [hook]
    (record,) = records(caplog)
    assert record.levelno == logging.ERROR and record.exc_info and record.exc_info[0] is KeyError
    assert "Owner.step raised KeyError" in record.getMessage()


def test_a_fault_after_the_original_keeps_its_result():
    guard, step, released = guarded(before=lambda hook, owner, x, **k: x * 10,
                                    after=lambda hook, owner, ctx, result, *a, **k: boom())
    owner = Owner()
    owner.__dict__[ATTR] = Hook()
    assert step(owner, 4) == 4 and owner.calls == [(4, 0)]
    assert owner.__dict__[ATTR] is None and guard.errors == 1


def test_the_parts_see_the_call_and_each_other():
    seen = []
    guard, step, _ = guarded(before=lambda hook, owner, x, y=0: ("ctx", x, y),
                             after=lambda hook, owner, ctx, result, x, y=0: seen.append((ctx, result)))
    owner = Owner()
    owner.__dict__[ATTR] = Hook()
    step(owner, 1, y=2)
    assert seen == [(("ctx", 1, 2), 3)] and guard.errors == 0


def test_vllms_own_errors_pass_through_untouched(caplog):
    guard, step, released = guarded(before=lambda *a, **k: None, after=lambda *a, **k: None)
    owner = Owner(fail_inside=lambda o: boom())
    owner.__dict__[ATTR] = hook = Hook()
    with pytest.raises(KeyError):
        step(owner, 1)
    assert owner.__dict__[ATTR] is hook and guard.errors == 0 and not records(caplog)


def test_a_fault_inside_the_original_skips_the_after_part():
    # e.g. the per-request count in make_spec_decoding_stats, called by vLLM's update_from_output
    guard, inner, _ = guarded(before=boom)
    outer = guard.wrap(lambda owner, x: inner(owner, x) * 2, after=lambda *a: pytest.fail("after ran"))
    owner = Owner()
    owner.__dict__[ATTR] = Hook()
    assert outer(owner, 3) == 6 and guard.errors == 1


def test_a_release_that_fails_again_is_swallowed():
    guard, step, _ = guarded(before=boom, release=lambda owner, hook: boom())
    owner = Owner()
    owner.__dict__[ATTR] = Hook()
    assert step(owner, 1) == 1 and guard.errors == 1


def test_a_fault_while_attaching_leaves_vllm_alone():
    class Scheduler:
        def __init__(self, n):
            self.n = n

    released = []
    guard = fail_open.FailOpen(ATTR, lambda owner, hook: released.append(hook))
    init = guard.wrap_init(Scheduler.__init__, attach=lambda owner: boom())
    s = Scheduler.__new__(Scheduler)
    init(s, 7)
    assert s.n == 7 and s.__dict__[ATTR] is None and guard.errors == 1 and released == [None]


def test_the_snapshot_carries_the_error_count_to_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path / "m"))
    writer = metrics.SnapshotWriter()
    writer.write(dict, force=True, errors=1)  # as after a fault while attaching: no phases
    families = {f.name: f for f in metrics.PhaseCollector(str(tmp_path / "m")).collect()}
    (sample,) = families["dspark_dynamic:controller_errors"].samples
    assert sample.name == "dspark_dynamic:controller_errors_total" and sample.value == 1.0
    assert set(sample.labels) == {"engine"}
    writer.remove()


def test_a_metrics_write_that_fails_raises_to_the_guard(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path / "m"))
    writer = metrics.SnapshotWriter()
    shutil.rmtree(tmp_path / "m")  # removed mid-run
    with pytest.raises(OSError):
        writer.write(dict, force=True)


class FullDisk:
    def __init__(self):
        self.closed = False

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        self.closed = True
        self.flush()


def test_a_trace_on_a_full_disk_raises_then_stops_quietly():
    trace = FullDisk()
    stats = PhaseStats(trace)
    stats.record(Phase.REASONING, 1, 1, 2, "r")  # its row is written with the step's
    with pytest.raises(OSError):
        stats.record_step_time(0.01, 1, 1, 1)
    stats.stop_trace()  # the flush fails again: dropped
    assert trace.closed
    stats.record(Phase.REASONING, 1, 1, 2, "r")  # no trace any more; the counts go on
    stats.close()
    assert stats.totals[Phase.REASONING].steps == 2
