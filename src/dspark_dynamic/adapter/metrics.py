"""Per-phase Prometheus metrics on vLLM's ``/metrics``.

The counters live in the engine-core process (the scheduler); ``/metrics`` is served by the API
server process.  Transport: the engine core writes a JSON snapshot of its cumulative per-phase counters into a
private directory (``mkdtemp``, mode 0700) that the argument-parsing process creates once the
plugin is configured and exports as ``DSPARK_DYNAMIC_METRICS_DIR`` to the engine processes it
starts; in the API server a vLLM stat-logger plugin (entry point group
``vllm.stat_logger_plugins``) registers a Prometheus collector that reads the snapshots at scrape
time.  A directory or snapshot that is not this user's own is never used; a malformed snapshot is
skipped.  Series (label ``phase`` =
reasoning|answer; ``engine`` = engine-core pid):

- ``dspark_dynamic:steps_total``                 request-steps that verified drafts
- ``dspark_dynamic:verified_draft_tokens_total`` drafts verified (== vllm:spec_decode_num_draft_tokens)
- ``dspark_dynamic:accepted_draft_tokens_total`` drafts accepted (== vllm:spec_decode_num_accepted_tokens)
- ``dspark_dynamic:generated_tokens_total``      tokens produced by decode steps
- ``dspark_dynamic:depth_steps_total``           request-steps by chosen depth (label ``depth``)
- ``dspark_dynamic:tracked_requests``            requests the controller holds state for (gauge)

Limitation: with ``--api-server-count`` > 1 vLLM serves ``/metrics`` from its multiprocess
registry only, and these series are absent.
"""

from __future__ import annotations

import atexit
import glob
import json
import logging
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("vllm.dspark_dynamic")

METRICS_DIR_ENV = "DSPARK_DYNAMIC_METRICS_DIR"
PREFIX = "dspark_dynamic:"
WRITE_INTERVAL_S = 0.25


def _private_dir_of_this_user(path: str) -> bool:
    """A real directory (not a link), owned by this user, writable by nobody else."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _remove_dir_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:  # an engine's snapshot is still there, or already gone
        pass


def metrics_dir() -> str:
    """This process's snapshot directory.

    The one named by ``DSPARK_DYNAMIC_METRICS_DIR`` (inherited from the process that parsed the
    arguments) when it is a private directory of this user, or could be created as one; else a
    new ``mkdtemp`` directory (mode 0700), exported for the engine processes started later.
    A directory another user made (or could write to) is never used: they could feed numbers
    to ``/metrics`` or read what the engines write.
    """
    path = os.environ.get(METRICS_DIR_ENV)
    if path:
        try:
            os.mkdir(path, 0o700)
            atexit.register(_remove_dir_if_empty, path)
        except FileExistsError:
            pass
        except OSError as exc:
            logger.warning("dspark_dynamic: metrics directory %r cannot be created (%s); using a new one", path, exc)
            path = None
        if path and not _private_dir_of_this_user(path):
            logger.warning(
                "dspark_dynamic: metrics directory %r is not a private directory of this user; using a new one", path
            )
            path = None
    if not path:
        path = tempfile.mkdtemp(prefix="dspark-dynamic-metrics-")
        os.environ[METRICS_DIR_ENV] = path
        atexit.register(_remove_dir_if_empty, path)
    return path


class SnapshotWriter:
    """Engine-core side: writes this process's counters, at most every ``WRITE_INTERVAL_S``."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory or metrics_dir()
        self.path = os.path.join(self.directory, f"engine-{os.getpid()}.json")
        self._last = 0.0
        atexit.register(self.remove)

    def write(self, snapshot: Callable[[], dict[str, Any]], force: bool = False, tracked: int = 0) -> None:
        """Write ``snapshot()`` and the number of requests the controller tracks (``tracked``) if
        the interval has passed (or ``force``); otherwise do nothing, not even build the snapshot
        (this runs after every engine step)."""
        now = time.monotonic()
        if not force and now - self._last < WRITE_INTERVAL_S:
            return
        self._last = now
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"pid": os.getpid(), "phases": snapshot(), "tracked": tracked}, f)
            os.replace(tmp, self.path)
        except OSError as exc:  # metrics must never break serving
            logger.debug("dspark_dynamic: metrics snapshot not written: %s", exc)

    def remove(self) -> None:
        for action in (lambda: os.remove(self.path), lambda: os.rmdir(self.directory)):
            try:
                action()
            except OSError:  # already gone, or another engine's snapshot is still there
                pass


def _valid_snapshot(data: Any) -> bool:
    if not isinstance(data, dict) or not isinstance(data.get("phases"), dict):
        return False
    for counts in data["phases"].values():
        if not isinstance(counts, dict):
            return False
        for key, value in counts.items():
            if key == "depth_counts":
                if not isinstance(value, dict) or not all(isinstance(n, (int, float)) for n in value.values()):
                    return False
            elif key != "accepted_per_pos" and not isinstance(value, (int, float)):
                return False
    return isinstance(data.get("tracked", 0), (int, float))


def read_snapshots(directory: str) -> list[dict[str, Any]]:
    """The engines' snapshots; a file that is not this user's, unreadable or malformed is skipped."""
    out = []
    uid = os.getuid()
    for path in sorted(glob.glob(os.path.join(directory, "engine-*.json"))):
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                logger.debug("dspark_dynamic: skipping metrics snapshot %s: not a file of this user", path)
                continue
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            logger.debug("dspark_dynamic: skipping metrics snapshot %s: %s", path, exc)
            continue
        if not _valid_snapshot(data):
            logger.debug("dspark_dynamic: skipping malformed metrics snapshot %s", path)
            continue
        out.append(data)
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
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
        tracked = GaugeMetricFamily(f"{PREFIX}tracked_requests",
                                    "dspark_dynamic: requests the depth controller holds state for",
                                    labels=["engine"])
        for snap in snapshots:
            tracked.add_metric([str(snap.get("pid", ""))], float(snap.get("tracked", 0)))
        yield from families.values()
        yield depth
        yield tracked


_collector_lock = threading.Lock()
_registered: PhaseCollector | None = None


def register_collector(registry: Any = None) -> PhaseCollector:
    """Add the collector to ``registry`` (prometheus_client's default) once per process."""
    global _registered
    with _collector_lock:
        if _registered is None:
            if registry is None:
                from prometheus_client import REGISTRY as registry
            _registered = PhaseCollector(metrics_dir())
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
        from dspark_dynamic.adapter.build import raw_options

        self.enabled = raw_options(getattr(vllm_config, "additional_config", None)) is not None
        if self.enabled:
            register_collector()

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0, *args: Any, **kwargs: Any) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None
