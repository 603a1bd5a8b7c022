"""Per-phase Prometheus metrics on vLLM's ``/metrics``.

The counters live in the engine-core process (the scheduler); ``/metrics`` is served by the API
server process.  Transport: the engine core writes a JSON snapshot of its cumulative per-phase counters into a
private directory (``mkdtemp``, mode 0700) that the argument-parsing process creates once the
plugin is configured and exports as ``DSPARK_DYNAMIC_METRICS_DIR`` to the engine processes it
starts; in the API server a vLLM stat-logger plugin (entry point group
``vllm.stat_logger_plugins``) registers a Prometheus collector that reads the snapshots at scrape
time.  A directory or snapshot that is not this user's own is never used; a malformed snapshot is
skipped.

With several API servers (``--api-server-count`` > 1, which ``--data-parallel-size`` N implies)
vLLM serves ``/metrics`` from prometheus_client's multiprocess registry: ``vllm serve`` sets
``PROMETHEUS_MULTIPROC_DIR`` before it starts the engine cores and API servers, every process
writes its metric values into that directory, and each API server's ``/metrics`` merges all of
them (``vllm/v1/metrics/prometheus.py``, ``vllm/entrypoints/serve/instrumentator/metrics.py``).
A collector registered in one API server is not part of that registry, so there the engine core
also writes its series into that directory itself, as prometheus_client multiprocess values
(``MultiprocessPublisher``): whichever API server answers, ``/metrics`` has every engine's
series.  Series (label ``phase`` = reasoning|answer; ``engine`` = vLLM's engine index, the
data-parallel rank, as on vLLM's own series):

- ``dspark_dynamic:steps_total``                 request-steps that verified drafts
- ``dspark_dynamic:verified_draft_tokens_total`` drafts verified (== vllm:spec_decode_num_draft_tokens)
- ``dspark_dynamic:accepted_draft_tokens_total`` drafts accepted (== vllm:spec_decode_num_accepted_tokens)
- ``dspark_dynamic:generated_tokens_total``      tokens produced by decode steps
- ``dspark_dynamic:depth_steps_total``           request-steps by chosen depth (label ``depth``)
- ``dspark_dynamic:policy_steps_total``, ``policy_verified_draft_tokens_total``,
  ``policy_accepted_draft_tokens_total``, ``policy_generated_tokens_total``: the same counts by
  the request's policy (label ``policy``: ``fixed K``, ``phase R/A``, or the server's policy;
  see ``core/request_policy.py``); summed over ``policy`` they equal the series above
- ``dspark_dynamic:tracked_requests``            requests the controller holds state for (gauge)
- ``dspark_dynamic:controller_errors_total``     faults in the plugin that detached the controller
  (label ``engine`` only; see ``adapter/fail_open.py``)
- ``dspark_dynamic:estimated_speedup``           the live estimate (gauge; labels ``phase`` =
  reasoning|answer|all, ``vs`` = plain|fixed; the adaptive policy, or any with ``live_estimate``,
  once its costs are learned; see ``core/estimate.py``, ``core/live.py``)

Limitation: an engine core whose snapshot directory the API server cannot read (a data-parallel
engine on another node, started with ``--headless``) is missing from ``/metrics``; the API server
says so once per engine at start-up (its log line still reports the counts).
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
WRITE_INTERVAL_S = 1.0  # a snapshot costs ~1 ms on the CPU testbed (a twelfth of a step); idle engines write at once
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's; vLLM sets it for several API servers


def engine_label(vllm_config: Any) -> str:
    """vLLM's engine index for this engine core: the data-parallel rank (``data_parallel_index``,
    which vLLM keeps even where it resets the rank of an independent dense-model DP engine)."""
    parallel = getattr(vllm_config, "parallel_config", None)
    for attr in ("data_parallel_index", "data_parallel_rank"):
        value = getattr(parallel, attr, None)
        if isinstance(value, int):
            return str(value)
    return "0"


def snapshot_engine(snap: dict[str, Any]) -> str:
    """The ``engine`` label of a snapshot (snapshots of older versions name only the pid)."""
    return str(snap.get("engine", snap.get("pid", "")))


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

    def __init__(self, directory: str | None = None, engine: str = "0") -> None:
        self.directory = directory or metrics_dir()
        self.engine = engine  # vLLM's engine index (``engine_label``)
        self.path = os.path.join(self.directory, f"engine-{os.getpid()}.json")
        self._last = time.monotonic()  # the last periodic write (forced writes leave it alone)
        self._busy = False  # whether the last write had requests tracked
        # vLLM's /metrics reads prometheus_client's multiprocess directory: write there too
        self.publisher = MultiprocessPublisher.for_engine(engine) if os.environ.get(MULTIPROC_DIR_ENV) else None
        atexit.register(self.remove)
        try:  # announce this engine at once: the API server checks at start-up that it sees every engine
            self._dump({"pid": os.getpid(), "engine": engine, "phases": {}, "tracked": 0})
        except OSError as exc:
            logger.debug("dspark_dynamic: metrics snapshot not written: %s", exc)

    def _dump(self, data: dict[str, Any]) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)

    def due(self, tracked: int) -> bool:
        """Whether ``write`` without ``force`` would write now (its throttle, without the call)."""
        return (tracked > 0) != self._busy or time.monotonic() - self._last >= WRITE_INTERVAL_S

    def write(self, snapshot: Callable[[], dict[str, Any]], force: bool = False, tracked: int = 0,
              errors: int = 0, estimate: Callable[[], Any] | None = None,
              policies: Callable[[], dict[str, Any]] | None = None) -> None:
        """Write ``snapshot()``, the number of requests the controller tracks (``tracked``) and
        the faults that detached it (``errors``) if ``WRITE_INTERVAL_S`` has passed since the
        last periodic write, if ``tracked`` crossed between 0 and more since the last write, or
        if ``force``; otherwise do nothing, not even build the snapshot (this runs after every
        engine step).  So ``tracked_requests`` is 0 on ``/metrics`` exactly while the engine
        tracks nothing, and its count is at most ``WRITE_INTERVAL_S`` old.  Periodic writes keep
        their pace whatever other writes come between (an engine that idles between bursts of
        requests writes at every idle moment).
        A failure to write raises: the caller's fail-open guard (``adapter/fail_open.py``) logs
        it, counts it and detaches the controller, so serving goes on."""
        if not force and (tracked > 0) == self._busy:
            now = time.monotonic()
            if now - self._last < WRITE_INTERVAL_S:
                return
            self._last = now
        self._busy = tracked > 0
        data = {"pid": os.getpid(), "engine": self.engine, "phases": snapshot(), "tracked": tracked,
                "controller_errors": errors, "estimate": estimate() if estimate is not None else None,
                "policies": policies() if policies is not None else {}}
        self._dump(data)
        if self.publisher is not None:
            self.publisher.publish(data)

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
    if not isinstance(data.get("engine", ""), (str, int)):
        return False
    policies = data.get("policies") or {}
    if not isinstance(policies, dict) or not all(
        isinstance(phases, dict) and all(
            isinstance(counts, dict) and all(isinstance(v, (int, float)) for v in counts.values())
            for counts in phases.values())
        for phases in policies.values()):
        return False
    return isinstance(data.get("tracked", 0), (int, float)) and isinstance(data.get("controller_errors", 0), (int, float))


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

    def __init__(self, directory: str, snapshots: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.directory = directory
        self.snapshots = snapshots or (lambda: read_snapshots(self.directory))  # or given (the publisher's own)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshots = self.snapshots()
        families = {
            key: CounterMetricFamily(f"{PREFIX}{name}", f"dspark_dynamic: {doc}, by reasoning phase",
                                     labels=["phase", "engine"])
            for name, key, doc in self.COUNTERS
        }
        depth = CounterMetricFamily(f"{PREFIX}depth_steps", "dspark_dynamic: request-steps by chosen depth",
                                    labels=["phase", "depth", "engine"])
        for snap in snapshots:
            engine = snapshot_engine(snap)
            for phase, counts in snap.get("phases", {}).items():
                for key, family in families.items():
                    family.add_metric([phase, engine], float(counts.get(key, 0)))
                for k, n in sorted(counts.get("depth_counts", {}).items()):
                    depth.add_metric([phase, str(k), engine], float(n))
        tracked = GaugeMetricFamily(f"{PREFIX}tracked_requests",
                                    "dspark_dynamic: requests the depth controller holds state for",
                                    labels=["engine"])
        errors = CounterMetricFamily(f"{PREFIX}controller_errors",
                                     "dspark_dynamic: faults in the plugin that detached the depth controller "
                                     "(vLLM's own speculative decoding resumed)", labels=["engine"])
        by_policy = {
            key: CounterMetricFamily(f"{PREFIX}policy_{name}", f"dspark_dynamic: {doc}, by request policy and "
                                     "reasoning phase", labels=["policy", "phase", "engine"])
            for name, key, doc in self.COUNTERS
        }
        for snap in snapshots:
            engine = snapshot_engine(snap)
            for policy, phases in (snap.get("policies") or {}).items():
                for phase, counts in phases.items():
                    for key, family in by_policy.items():
                        family.add_metric([policy, phase, engine], float(counts.get(key, 0)))
        yield from (family for family in by_policy.values() if family.samples)
        for snap in snapshots:
            tracked.add_metric([snapshot_engine(snap)], float(snap.get("tracked", 0)))
            errors.add_metric([snapshot_engine(snap)], float(snap.get("controller_errors", 0)))
        yield from families.values()
        yield depth
        yield tracked
        yield errors
        yield from self.confidence_families(snapshots)
        estimate = GaugeMetricFamily(
            f"{PREFIX}estimated_speedup",
            "dspark_dynamic: estimated speed-up of what ran over plain decoding (vs=plain) and over the fixed "
            "configured depth (vs=fixed), by reasoning phase (all: overall); from the learned step costs and "
            "acceptance (the adaptive policy, or any with live_estimate, once its costs are learned)",
            labels=["phase", "vs", "engine"])
        for snap in snapshots:
            for phase, ratios in (snap.get("estimate") or {}).items():
                for vs, value in ratios.items():
                    estimate.add_metric([phase, vs, snapshot_engine(snap)], float(value))
        if estimate.samples:
            yield estimate

    CONFIDENCE = (  # (series, snapshot key, Counter | Gauge, documentation)
        ("confidence_labels", "conf_labels", True, "draft-confidence labels (verified drafts up to the first rejected)"),
        ("confidence_predicted", "conf_predicted", True, "sum of the predicted acceptance probabilities of those labels"),
        ("confidence_accepted", "conf_accepted", True, "accepted labels (predicted / labels vs accepted / labels: calibration)"),
        ("confidence_auc", "conf_auc", False, "ROC-AUC of the calibrated draft confidences (out of sample)"),
        ("confidence_calibration_error", "conf_ece", False, "expected calibration error of the draft confidences"),
    )

    def confidence_families(self, snapshots: list[dict[str, Any]]):
        """Per phase and engine, for policies that gate on draft confidences (absent otherwise)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for name, key, counter, doc in self.CONFIDENCE:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = kind(f"{PREFIX}{name}", f"dspark_dynamic: {doc}, by reasoning phase", labels=["phase", "engine"])
            for snap in snapshots:
                for phase, counts in snap.get("phases", {}).items():
                    if key in counts:
                        family.add_metric([phase, snapshot_engine(snap)], float(counts[key]))
            if family.samples:
                yield family


class MultiprocessPublisher:
    """Engine-core side, when ``PROMETHEUS_MULTIPROC_DIR`` is set (vLLM with several API servers):
    this engine's series, written as prometheus_client multiprocess values into that directory.

    Every API server's ``/metrics`` (vLLM's registry with a ``MultiProcessCollector``) merges the
    files there: counters are summed over processes (each engine writes only its own ``engine``
    label), the ``tracked_requests`` gauge takes the most recent value, as vLLM's own gauges do.
    The families are exactly ``PhaseCollector``'s, over this engine's snapshot.  The values get a
    file name of their own (``counter_dsparkdynamic<pid>.db``): prometheus_client's per-process
    files must have a single writer, and vLLM may write ``counter_<pid>.db`` in this process too.
    A failure is logged once and ends publishing; it never reaches the engine.
    """

    _instance: "MultiprocessPublisher | None" = None

    @classmethod
    def for_engine(cls, engine: str) -> "MultiprocessPublisher":
        """One per process (the files are per process); the first engine label wins."""
        if cls._instance is None or cls._instance.pid != os.getpid():
            cls._instance = cls(engine)
        return cls._instance

    def __init__(self, engine: str) -> None:
        from prometheus_client import values

        self.pid = os.getpid()
        self.engine = engine
        self.directory = os.environ[MULTIPROC_DIR_ENV]
        self._value_class = values.MultiProcessValue(lambda: f"dsparkdynamic{os.getpid()}")
        self._values: dict[tuple, Any] = {}
        self.failed = False
        logger.info("dspark_dynamic: engine %s writes its per-phase series into vLLM's multiprocess metrics "
                    "directory (%s=%s); every API server's /metrics shows them", engine, MULTIPROC_DIR_ENV,
                    self.directory)

    def publish(self, data: dict[str, Any]) -> None:
        if self.failed:
            return
        try:
            now = time.time()
            for family in PhaseCollector("", snapshots=lambda: [data]).collect():
                if family.type not in ("counter", "gauge"):
                    continue
                for sample in family.samples:
                    key = (sample.name, tuple(sample.labels.items()))
                    value = self._values.get(key)
                    if value is None:
                        mode = "mostrecent" if family.type == "gauge" else ""
                        value = self._value_class(family.type, family.name, sample.name, list(sample.labels),
                                                  list(sample.labels.values()), family.documentation,
                                                  multiprocess_mode=mode)
                        self._values[key] = value
                    value.set(sample.value, timestamp=now if family.type == "gauge" else None)
        except Exception as exc:  # metrics must never break serving
            self.failed = True
            logger.warning("dspark_dynamic: writing the per-phase series into %s failed (%r); they stay off "
                           "/metrics from now on (the engine's log line still reports them)", self.directory, exc)


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


_checked_engines: set[str] = set()


def check_engine_visible(engine: str, directory: str | None = None) -> bool:
    """API-server side, at start-up (vLLM builds its stat loggers once every engine is ready, and
    each engine announces itself when its controller is attached): whether this process sees
    ``engine``'s snapshot.  If not, say once that its series are missing from ``/metrics``."""
    directory = directory or metrics_dir()
    if any(snapshot_engine(snap) == engine for snap in read_snapshots(directory)):
        return True
    if engine not in _checked_engines:
        _checked_engines.add(engine)
        logger.warning(
            "dspark_dynamic: engine %s has no per-phase snapshot in %s that this API server can read (an engine "
            "on another node, e.g. started with --headless?): its dspark_dynamic:* series are missing from "
            "/metrics; the engine's own log line still reports them", engine, directory)
    return False


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
            check_engine_visible(str(engine_index))

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0, *args: Any, **kwargs: Any) -> None:
        return None

    def log_engine_initialized(self) -> None:
        return None
