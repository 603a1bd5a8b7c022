"""Per-phase Prometheus metrics on vLLM's ``/metrics``.

The counters live in the engine-core process (the scheduler); ``/metrics`` is served by the API
server process.  Transport: the engine core writes a JSON snapshot of its cumulative per-phase
counters into a directory named by ``DSPARK_DYNAMIC_METRICS_DIR`` (created by ``register()`` in
the first vLLM process and inherited by the engine processes it starts); in the API server a
vLLM stat-logger plugin (entry point group ``vllm.stat_logger_plugins``) registers a Prometheus
collector that reads the snapshots at scrape time.  Series (label ``phase`` =
reasoning|answer; ``engine`` = engine-core pid):

- ``dspark_dynamic:steps_total``                 request-steps that verified drafts
- ``dspark_dynamic:verified_draft_tokens_total`` drafts verified (== vllm:spec_decode_num_draft_tokens)
- ``dspark_dynamic:accepted_draft_tokens_total`` drafts accepted (== vllm:spec_decode_num_accepted_tokens)
- ``dspark_dynamic:generated_tokens_total``      tokens produced by decode steps
- ``dspark_dynamic:depth_steps_total``           request-steps by chosen depth (label ``depth``)

Limitation: with ``--api-server-count`` > 1 vLLM serves ``/metrics`` from its multiprocess
registry only, and these series are absent.
"""

from __future__ import annotations

import atexit
import glob
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("vllm.dspark_dynamic")

METRICS_DIR_ENV = "DSPARK_DYNAMIC_METRICS_DIR"
PREFIX = "dspark_dynamic:"
WRITE_INTERVAL_S = 0.25


def ensure_metrics_dir() -> str:
    """The snapshot directory's path; the first process to ask names it and exports the variable
    (nothing is created on disk until an engine writes a snapshot)."""
    path = os.environ.get(METRICS_DIR_ENV)
    if not path:
        path = os.path.join(tempfile.gettempdir(), f"dspark-dynamic-metrics-{os.getpid()}")
        os.environ[METRICS_DIR_ENV] = path
    return path


class SnapshotWriter:
    """Engine-core side: writes this process's counters, at most every ``WRITE_INTERVAL_S``."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or ensure_metrics_dir()
        self.path = os.path.join(self.directory, f"engine-{os.getpid()}.json")
        self._last = 0.0
        atexit.register(self.remove)

    def write(self, snapshot: Callable[[], dict[str, Any]], force: bool = False) -> None:
        """Write ``snapshot()`` if the interval has passed (or ``force``); otherwise do nothing,
        not even build the snapshot (this runs after every engine step)."""
        now = time.monotonic()
        if not force and now - self._last < WRITE_INTERVAL_S:
            return
        self._last = now
        tmp = f"{self.path}.tmp"
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump({"pid": os.getpid(), "phases": snapshot()}, f)
            os.replace(tmp, self.path)
        except OSError as exc:  # metrics must never break serving
            logger.debug("dspark_dynamic: metrics snapshot not written: %s", exc)

    def remove(self) -> None:
        for action in (lambda: os.remove(self.path), lambda: os.rmdir(self.directory)):
            try:
                action()
            except OSError:  # already gone, or another engine's snapshot is still there
                pass


def read_snapshots(directory: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "engine-*.json"))):
        try:
            with open(path) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


class PhaseCollector:
    """Prometheus collector over the engine-core snapshots."""

    COUNTERS = (
        ("steps", "steps", "Request-steps that verified at least one draft"),
        ("verified_draft_tokens", "verified", "Draft tokens verified"),
        ("accepted_draft_tokens", "accepted", "Draft tokens accepted"),
        ("generated_tokens", "tokens", "Tokens produced by decode steps"),
    )

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        snapshots = read_snapshots(self.directory)
        families = {
            key: CounterMetricFamily(f"{PREFIX}{name}", f"dspark_dynamic: {doc}, by reasoning phase",
                                     labels=["phase", "engine"])
            for name, key, doc in self.COUNTERS
        }
        depth = CounterMetricFamily(f"{PREFIX}depth_steps", "dspark_dynamic: request-steps by chosen depth",
                                    labels=["phase", "depth", "engine"])
        for snap in snapshots:
            engine = str(snap.get("pid", ""))
            for phase, counts in snap.get("phases", {}).items():
                for key, family in families.items():
                    family.add_metric([phase, engine], float(counts.get(key, 0)))
                for k, n in sorted(counts.get("depth_counts", {}).items()):
                    depth.add_metric([phase, str(k), engine], float(n))
        yield from families.values()
        yield depth


_collector_lock = threading.Lock()
_registered: PhaseCollector | None = None


def register_collector(registry: Any = None) -> PhaseCollector:
    """Add the collector to ``registry`` (prometheus_client's default) once per process."""
    global _registered
    with _collector_lock:
        if _registered is None:
            if registry is None:
                from prometheus_client import REGISTRY as registry
            _registered = PhaseCollector(ensure_metrics_dir())
            registry.register(_registered)
        return _registered


def _stat_logger_base() -> type:
    try:
        from vllm.v1.metrics.loggers import StatLoggerBase

        return StatLoggerBase
    except Exception:  # vLLM without stat-logger plugins: keep the module importable
        return object


class PhaseMetricsLogger(_stat_logger_base()):  # type: ignore[misc]
    """vLLM stat-logger plugin: exposes the per-phase series on the API server's /metrics.

    Installed but not configured (no ``dspark_dynamic`` in ``additional_config``), it does nothing.
    """

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        from dspark_dynamic.configure import raw_options

        self.enabled = raw_options(getattr(vllm_config, "additional_config", None)) is not None
        if self.enabled:
            register_collector()

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0, *args: Any, **kwargs: Any) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None
