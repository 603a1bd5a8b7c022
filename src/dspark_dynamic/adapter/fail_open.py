"""Fail open: a fault in the plugin never stops vLLM (adapter room).

Every vLLM method the plugin wraps is built by ``FailOpen.wrap`` (or ``wrap_init``): the plugin's
own code runs in a ``before`` part (ahead of vLLM's original) and an ``after`` part (once the
original returned), each inside one ``try``.  vLLM's original is called exactly once, outside
both, so vLLM's own errors pass through untouched and are never swallowed here.

When the plugin's code raises (a bug, a reasoning-parser plugin that raises, a full disk under
the trace file, a metrics directory that went away, a request shape a future vLLM brings),
``trip``:

1. detaches the plugin from the patched object (``owner.__dict__[attr] = None``): every later
   call of every wrapped method goes straight to vLLM's original, i.e. vLLM's own behaviour
   (the full configured depth, no draft bound);
2. logs it once, at ERROR, with its traceback;
3. counts it (``errors``; ``dspark_dynamic:controller_errors_total`` on ``/metrics``);
4. lets the owner release what the detached plugin held (``release(owner, hook)``, itself
   guarded: it may meet the same fault again).

What the plugin changed before the fault must stay valid for vLLM alone.  The scheduler hooks
only ever lower draft counts (a request's ``spec_token_ids`` cut to its first k drafts, a lower
``SchedulerOutput.num_spec_tokens_to_schedule``), which vLLM accepts in any step; from the next
step on vLLM drafts, schedules and verifies on its own.

Cost: a ``try`` block costs nothing until something raises; per call the wrapper adds one dict
lookup (is the plugin still attached?) and one call of the part it runs.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("vllm.dspark_dynamic")

LOG_PREFIX = "dspark_dynamic: fault in the plugin"

Before = Callable[..., Any]  # before(hook, owner, *args, **kwargs) -> ctx
After = Callable[..., None]  # after(hook, owner, ctx, result, *args, **kwargs)


class FailOpen:
    """The guard of one attachment point: the plugin state lives in ``owner.__dict__[attr]``.

    ``release(owner, hook)`` runs once after a fault (``hook`` is None when the fault struck
    while attaching); ``describe_fallback`` completes the log line (what vLLM does now).
    One instance per attachment point, shared by every module that patches the same class
    (e.g. ``scheduler.GUARD`` for all ``Scheduler`` methods).
    """

    def __init__(self, attr: str, release: Callable[[Any, Any], None] | None = None,
                 fallback: str = "vLLM's own behaviour resumes") -> None:
        self.attr = attr
        self.release = release
        self.fallback = fallback
        self.errors = 0  # faults in this process (each engine core is its own process)

    def trip(self, owner: Any, where: str, exc: BaseException) -> None:
        """Detach the plugin from ``owner`` after ``exc``, log it once, count it, release."""
        hook = owner.__dict__.get(self.attr)
        owner.__dict__[self.attr] = None  # first: nothing below re-enters the plugin
        self.errors += 1
        logger.error(
            "%s (%s raised %s: %s); the depth controller is detached from this engine core "
            "(pid %d, fault %d), %s; serving continues",
            LOG_PREFIX, where, type(exc).__name__, exc, os.getpid(), self.errors, self.fallback,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        if self.release is not None:
            try:
                self.release(owner, hook)
            except Exception as again:  # the same fault may strike again (a full disk): stay open
                logger.debug("dspark_dynamic: releasing the detached controller failed: %r", again)

    def wrap(self, original: Callable[..., Any], before: Before | None = None, after: After | None = None,
             where: str | None = None) -> Callable[..., Any]:
        """``original`` with the plugin's ``before``/``after`` parts around it, guarded.

        ``before(hook, owner, *args, **kwargs)`` returns a context handed to
        ``after(hook, owner, ctx, result, *args, **kwargs)``; neither runs once the plugin is
        detached (``after`` neither when a fault inside the original detached it).
        """
        attr, trip = self.attr, self.trip
        where = where or getattr(original, "__qualname__", repr(original))

        if before is not None and after is None:  # the lean form (per request-step hooks)
            @functools.wraps(original)
            def before_only(owner: Any, *args: Any, **kwargs: Any) -> Any:
                hook = owner.__dict__.get(attr)
                if hook is not None:
                    try:
                        before(hook, owner, *args, **kwargs)
                    except Exception as exc:
                        trip(owner, where, exc)
                return original(owner, *args, **kwargs)

            return before_only

        @functools.wraps(original)
        def wrapper(owner: Any, *args: Any, **kwargs: Any) -> Any:
            hook = owner.__dict__.get(attr)
            if hook is None:
                return original(owner, *args, **kwargs)
            ctx = None
            if before is not None:
                try:
                    ctx = before(hook, owner, *args, **kwargs)
                except Exception as exc:
                    trip(owner, where, exc)
                    return original(owner, *args, **kwargs)
            result = original(owner, *args, **kwargs)
            if after is not None and owner.__dict__.get(attr) is hook:
                try:
                    after(hook, owner, ctx, result, *args, **kwargs)
                except Exception as exc:
                    trip(owner, where, exc)
            return result

        return wrapper

    def wrap_init(self, original: Callable[..., Any], attach: Callable[[Any], None],
                  where: str | None = None) -> Callable[..., Any]:
        """``original`` (a constructor), then ``attach(owner)``, guarded: a fault while attaching
        leaves the object without the plugin (vLLM's own behaviour from its first call)."""
        attr, trip = self.attr, self.trip
        where = where or getattr(original, "__qualname__", repr(original))

        @functools.wraps(original)
        def __init__(owner: Any, *args: Any, **kwargs: Any) -> None:
            original(owner, *args, **kwargs)
            owner.__dict__[attr] = None
            try:
                attach(owner)
            except Exception as exc:
                trip(owner, where, exc)

        return __init__
