"""Fault injection for the fail-open tests (tests only; the plugin never imports this module).

``engine_run`` imports it when its spec has ``"faults"``: one entry per batch, ``None`` or
``{"at": POINT, "after": N}``.  ``install`` patches, in the engine process, what the scheduler
hooks call; ``arm`` (before each faulty batch) attaches a fresh controller to the engine's
scheduler (the previous fault detached the last one), and arms the batch's point: from its ``N+1``-th call on, it
raises ``InjectedFault`` (every call: a guard that did not detach would meet it again).

POINT            where it strikes                               hook (``Scheduler`` method)
``init``         ``build_controller``                            ``__init__`` (armed at install)
``schedule``     ``DepthController.before_schedule``             ``schedule``
``plan``         ``DepthController.plan_drafts``                 ``_update_after_schedule``
``after_output`` ``DepthController.after_output``                ``update_from_output``
``spec_stats``   the per-request count (``hook.counted[...]``)   ``make_spec_decoding_stats``
``free_request`` ``DepthController.forget``                      ``_free_request``
``trace_full``   the trace file: its ``N+1``-th row raises ``OSError(ENOSPC)`` (trace writer)
``metrics_dir_removed`` / ``metrics_dir_unwritable``: at the ``N+1``-th ``after_output`` the
                 snapshot directory is removed / replaced by a file (a directory no file can be
                 created in, whoever runs the test: root ignores permission bits) (metrics writer)
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import shutil
from typing import Any

from dspark_dynamic.adapter import fail_open, metrics
from dspark_dynamic.adapter.patches import scheduler as sched
from dspark_dynamic.core.controller import DepthController
from dspark_dynamic.core.stats import PhaseStats

RAISING = {"schedule": "before_schedule", "plan": "plan_drafts", "after_output": "after_output",
           "free_request": "forget"}
POINTS = ("init", *RAISING, "spec_stats", "trace_full", "metrics_dir_removed", "metrics_dir_unwritable")


class InjectedFault(RuntimeError):
    """Raised by an armed fault point."""


class Trigger:
    def __init__(self, point: str, after: int) -> None:
        self.point, self.after, self.calls, self.fired = point, after, 0, 0

    def hit(self) -> bool:
        self.calls += 1
        if self.calls > self.after:
            self.fired += 1
            return True
        return False


_armed: dict[str, Trigger] = {}
_records: list[dict[str, Any]] = []
_installed = False


def _hit(point: str) -> bool:
    trigger = _armed.get(point)
    return trigger is not None and trigger.hit()


def _raise(point: str) -> None:
    raise InjectedFault(f"injected fault at {point} (test)")


def _raising(point: str, method: Any) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _hit(point):
            _raise(point)
        return method(*args, **kwargs)

    return wrapper


class _Counts(dict):
    """``SchedulerHook.counted`` while ``spec_stats`` may be armed."""

    def __setitem__(self, key: Any, value: Any) -> None:
        if _hit("spec_stats"):
            _raise("spec_stats")
        super().__setitem__(key, value)


class FullDisk:
    """A trace file on a full disk: ``after`` rows are written, then every write raises ENOSPC."""

    def __init__(self, after: int) -> None:
        self.after, self.rows, self.closed = after, 0, False

    def write(self, text: str) -> int:
        self.rows += 1
        if self.rows > self.after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return len(text)

    def flush(self) -> None:
        if self.rows > self.after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        self.closed = True
        self.flush()


def _capture(logger: logging.Logger) -> None:
    """Keep the fail-open records this logger emits (wrapping its ``handle``: vLLM's logging
    set-up, applied again while an engine starts, drops handlers added to its children)."""
    handle = logger.handle

    def capture(record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(fail_open.LOG_PREFIX):
            _records.append({"message": message, "traceback": record.exc_info is not None,
                             "level": record.levelname})
        handle(record)

    logger.handle = capture  # type: ignore[method-assign]


def install(entries: list[dict[str, Any] | None]) -> None:
    """Patch the fault points (once per process); arm ``init`` now when the first batch asks."""
    global _installed
    if not _installed:
        _installed = True
        for point, name in RAISING.items():
            setattr(DepthController, name, _raising(point, getattr(DepthController, name)))
        after_output = DepthController.after_output

        @functools.wraps(after_output)
        def with_metrics_faults(controller: Any, *args: Any, **kwargs: Any) -> Any:
            for point in ("metrics_dir_removed", "metrics_dir_unwritable"):
                trigger = _armed.get(point)
                if trigger is not None and not trigger.fired and trigger.hit():
                    _break_metrics_dir(point)
            return after_output(controller, *args, **kwargs)

        DepthController.after_output = with_metrics_faults
        sched.SchedulerHook.counted = property(
            lambda hook: hook.__dict__.get("_counted"),
            lambda hook, value: hook.__dict__.__setitem__("_counted", None if value is None else _Counts(value)),
        )
        build = sched.build_controller

        def build_controller(vllm_config: Any) -> Any:
            if _hit("init"):
                _raise("init")
            return build(vllm_config)

        sched.build_controller = build_controller
        _capture(fail_open.logger)
    first = entries[0] if entries else None
    if first and first["at"] == "init":
        _armed["init"] = Trigger("init", int(first.get("after", 0)))


def _break_metrics_dir(point: str) -> None:
    hook = sched.latest_controller()
    directory = hook.metrics.directory
    shutil.rmtree(directory)
    if point == "metrics_dir_unwritable":
        with open(directory, "w") as f:
            f.write("not a directory\n")
    hook.metrics._last = float("-inf")  # the next step publishes (the throttle would hide the fault on a fast box)


def scheduler_of(llm: Any) -> Any:
    return llm.llm_engine.engine_core.engine_core.scheduler


def arm(llm: Any, entry: dict[str, Any] | None) -> None:
    """Before a batch: disarm the last point; for a fault, a fresh controller and ``entry`` armed."""
    if entry is not None and entry["at"] == "init":
        return  # armed at install, struck while the engine was built
    _records.clear()
    _armed.clear()
    if entry is None:
        return
    sched.attach(scheduler_of(llm))  # a fresh controller: this batch's counts are its own
    point, after = entry["at"], int(entry.get("after", 0))
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {POINTS}")
    if point == "trace_full":
        hook = sched.latest_controller()
        hook.controller.stats = PhaseStats(FullDisk(after))
        return
    _armed[point] = Trigger(point, after)


def report(llm: Any) -> dict[str, Any]:
    """After a batch: faults counted, whether the controller is still attached, what fired, and
    the fail-open log records of this batch."""
    return {
        "errors": sched.GUARD.errors,
        "attached": scheduler_of(llm).__dict__.get(sched.ATTR) is not None,
        "fired": {p: t.fired for p, t in _armed.items()},
        "records": list(_records),
        "snapshot": _snapshot(),
    }


def _snapshot() -> dict[str, Any] | None:
    """This engine's metrics snapshot as ``/metrics`` would read it, or None (none written)."""
    path = os.path.join(os.environ.get(metrics.METRICS_DIR_ENV, ""), f"engine-{os.getpid()}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
