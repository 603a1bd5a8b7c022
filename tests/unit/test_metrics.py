import json
import os

from dspark_dynamic.adapter import metrics


def test_snapshot_round_trip_and_collector(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path / "m"))
    writer = metrics.SnapshotWriter()
    snap = {"reasoning": {"steps": 3, "verified": 3, "accepted": 1, "tokens": 4, "depth_counts": {1: 3}},
            "answer": {"steps": 1, "verified": 2, "accepted": 2, "tokens": 3, "depth_counts": {2: 1}}}
    writer.write(lambda: snap, force=True)

    def must_not_run():
        raise AssertionError("snapshot built although the write was throttled")

    writer.write(must_not_run, force=False)  # throttled: not built, not written
    assert json.loads(open(writer.path).read())["phases"]["reasoning"]["steps"] == 3
    families = {f.name: f for f in metrics.PhaseCollector(str(tmp_path / "m")).collect()}
    verified = {s.labels["phase"]: s.value for s in families["dspark_dynamic:verified_draft_tokens"].samples}
    assert verified == {"reasoning": 3.0, "answer": 2.0}
    depth = {(s.labels["phase"], s.labels["depth"]): s.value for s in families["dspark_dynamic:depth_steps"].samples}
    assert depth == {("reasoning", "1"): 3.0, ("answer", "2"): 1.0}
    writer.remove()
    assert not (tmp_path / "m").exists()


def test_exposition_has_the_phase_label(tmp_path, monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest

    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    metrics.SnapshotWriter().write(lambda: {"answer": {"steps": 2, "verified": 4, "accepted": 3, "tokens": 6,
                                                       "depth_counts": {"2": 2}}}, force=True)
    registry = CollectorRegistry()
    registry.register(metrics.PhaseCollector(str(tmp_path)))
    text = generate_latest(registry).decode()
    assert 'dspark_dynamic:accepted_draft_tokens_total{engine=' in text and 'phase="answer"' in text


def test_unconfigured_stat_logger_registers_nothing():
    from types import SimpleNamespace

    logger = metrics.PhaseMetricsLogger(SimpleNamespace(additional_config={}))
    assert logger.enabled is False


def test_metrics_dir_is_private_and_exported(monkeypatch):
    import os
    import stat

    monkeypatch.delenv(metrics.METRICS_DIR_ENV, raising=False)
    path = metrics.metrics_dir()
    try:
        st = os.lstat(path)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert os.environ[metrics.METRICS_DIR_ENV] == path
        assert metrics.metrics_dir() == path  # inherited and reused: it is ours
    finally:
        os.rmdir(path)


def test_a_directory_others_can_write_is_never_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # like a directory another local user planted in /tmp
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(shared))
    path = metrics.metrics_dir()
    assert path != str(shared)
    link = tmp_path / "link"
    link.symlink_to(path)  # a symlink is not followed either, even to our own directory
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(link))
    assert metrics.metrics_dir() not in (str(link), str(shared))


def test_malformed_or_foreign_snapshots_are_skipped(tmp_path, monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest

    d = tmp_path / "m"
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(d))
    writer = metrics.SnapshotWriter()
    writer.write(lambda: {"answer": {"steps": 1, "verified": 2, "accepted": 2, "tokens": 3,
                                     "depth_counts": {"2": 1}}}, force=True)
    (d / "engine-1.json").write_text("{not json")
    (d / "engine-2.json").write_text(json.dumps({"phases": {"answer": {"steps": "many"}}}))
    (d / "engine-3.json").write_text(json.dumps(["a", "list"]))
    (d / "engine-4.json").symlink_to(writer.path)  # not a regular file
    snaps = metrics.read_snapshots(str(d))
    assert len(snaps) == 1
    registry = CollectorRegistry()
    registry.register(metrics.PhaseCollector(str(d)))
    text = generate_latest(registry).decode()  # /metrics still renders
    assert 'dspark_dynamic:verified_draft_tokens_total{engine=' in text


# -- the engine label, and the multiprocess transport (several API servers) --------------------


def test_engine_label_is_vllms_engine_index():
    from types import SimpleNamespace as NS

    assert metrics.engine_label(NS(parallel_config=NS(data_parallel_index=1, data_parallel_rank=0))) == "1"
    assert metrics.engine_label(NS(parallel_config=NS(data_parallel_rank=3))) == "3"
    assert metrics.engine_label(None) == "0"


def test_series_carry_the_engine_index_not_the_pid(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(metrics.MULTIPROC_DIR_ENV, raising=False)
    metrics.SnapshotWriter(engine="1").write(lambda: {"answer": {"steps": 1, "verified": 2, "accepted": 1,
                                                                 "tokens": 2, "depth_counts": {"2": 1}}}, force=True)
    (tmp_path / "engine-99.json").write_text(json.dumps({"pid": 99, "phases": {}, "tracked": 0}))  # an older engine
    families = {f.name: f for f in metrics.PhaseCollector(str(tmp_path)).collect()}
    assert {s.labels["engine"] for s in families["dspark_dynamic:steps"].samples} == {"1"}
    assert {s.labels["engine"] for s in families["dspark_dynamic:tracked_requests"].samples} == {"1", "99"}


def test_a_new_engine_announces_itself_and_the_api_server_warns_once_for_one_it_cannot_see(tmp_path, monkeypatch,
                                                                                            caplog):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(metrics.MULTIPROC_DIR_ENV, raising=False)
    metrics.SnapshotWriter(engine="0")  # attached, nothing counted yet: already visible
    assert metrics.check_engine_visible("0")
    with caplog.at_level("WARNING", logger="vllm.dspark_dynamic"):
        assert not metrics.check_engine_visible("7")  # e.g. an engine on another node
        assert not metrics.check_engine_visible("7")
    assert len([r for r in caplog.records if "engine 7" in r.getMessage()]) == 1


def _publish_in_a_process(multiproc_dir, snapshot_dir, engine: str, steps: int, tracked: int, extra: str = ""):
    """An engine-core process: PROMETHEUS_MULTIPROC_DIR set before it starts, as vLLM does."""
    import os
    import subprocess
    import sys

    code = (
        "from dspark_dynamic.adapter import metrics\n"
        f"{extra}\n"
        f"w = metrics.SnapshotWriter(engine={engine!r})\n"
        f"phases = {{'reasoning': {{'steps': {steps}, 'verified': {steps}, 'accepted': 1, 'tokens': {steps},"
        f" 'depth_counts': {{'1': {steps}}}}}}}\n"
        f"w.write(lambda: phases, force=True, tracked={tracked})\n"
        "phases['reasoning']['steps'] += 1\n"  # a later, larger value replaces the earlier one
        f"w.write(lambda: phases, force=True, tracked={tracked})\n"
    )
    env = {**os.environ, metrics.MULTIPROC_DIR_ENV: str(multiproc_dir), metrics.METRICS_DIR_ENV: str(snapshot_dir)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_engines_write_their_series_where_a_multiprocess_registry_reads_them(tmp_path, monkeypatch):
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from prometheus_client.parser import text_string_to_metric_families

    mp_dir, snap_dir = tmp_path / "prom", tmp_path / "snap"
    mp_dir.mkdir()
    # engine 1 in its own process, which also holds a metric of prometheus_client's own
    # multiprocess values (what a vLLM process writes): both land, in separate files
    own = ("from prometheus_client import Counter\n"
           "Counter('vllm:some_requests', 'x', registry=None).inc(5)")
    _publish_in_a_process(mp_dir, snap_dir, "1", steps=20, tracked=2, extra=own)
    # engine 0 here (a process whose prometheus_client was imported before the directory was set,
    # like a forked engine core: the publisher does not depend on prometheus_client's own choice)
    monkeypatch.setenv(metrics.MULTIPROC_DIR_ENV, str(mp_dir))
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(snap_dir))
    monkeypatch.setattr(metrics.MultiprocessPublisher, "_instance", None)
    writer = metrics.SnapshotWriter(engine="0")
    for steps in (10, 11):
        writer.write(lambda: {"reasoning": {"steps": steps, "verified": steps, "accepted": 1, "tokens": steps,
                                            "depth_counts": {"1": steps}}}, force=True)
    registry = CollectorRegistry()  # what vLLM's /metrics uses with several API servers
    multiprocess.MultiProcessCollector(registry, path=str(mp_dir))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    assert samples[("dspark_dynamic:steps_total", (("engine", "0"), ("phase", "reasoning")))] == 11
    assert samples[("dspark_dynamic:steps_total", (("engine", "1"), ("phase", "reasoning")))] == 21
    assert samples[("dspark_dynamic:depth_steps_total", (("depth", "1"), ("engine", "1"), ("phase", "reasoning")))] == 20
    assert samples[("dspark_dynamic:tracked_requests", (("engine", "1"),))] == 2
    assert samples[("dspark_dynamic:controller_errors_total", (("engine", "0"),))] == 0
    assert samples[("vllm:some_requests_total", ())] == 5


def test_without_a_multiprocess_directory_nothing_is_published(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(metrics.MULTIPROC_DIR_ENV, raising=False)
    assert metrics.SnapshotWriter(engine="0").publisher is None


def test_a_publishing_failure_is_logged_once_and_never_raises(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path / "snap"))
    monkeypatch.setenv(metrics.MULTIPROC_DIR_ENV, str(tmp_path / "missing"))  # no such directory
    monkeypatch.setattr(metrics.MultiprocessPublisher, "_instance", None)
    writer = metrics.SnapshotWriter(engine="0")
    snap = {"answer": {"steps": 1, "verified": 1, "accepted": 1, "tokens": 1, "depth_counts": {"1": 1}}}
    with caplog.at_level("WARNING", logger="vllm.dspark_dynamic"):
        writer.write(lambda: snap, force=True)
        writer.write(lambda: snap, force=True)
    assert writer.publisher.failed
    assert len([r for r in caplog.records if "stay off" in r.getMessage()]) == 1
    assert json.loads(open(writer.path).read())["engine"] == "0"  # the snapshot itself was written


def test_draft_confidence_calibration_per_phase_on_metrics(tmp_path, monkeypatch):
    import random

    from prometheus_client import CollectorRegistry, generate_latest

    from dspark_dynamic.core.confidence import ConfidenceCalibrator

    cal = ConfidenceCalibrator(2)
    rng = random.Random(0)
    for _ in range(500):
        right = rng.random() < 0.6
        cal.observe([rng.gauss(2.0 if right else -1.0, 1.5)], 1, int(right))
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    reasoning = {"steps": 500, "verified": 500, "accepted": cal.report.observed, "tokens": 900,
                 "depth_counts": {"1": 500}, **cal.report.metric_fields()}
    metrics.SnapshotWriter().write(lambda: {"reasoning": reasoning, "answer": {"steps": 0}}, force=True)
    registry = CollectorRegistry()
    registry.register(metrics.PhaseCollector(str(tmp_path)))
    text = generate_latest(registry).decode()

    def value(series):
        line = next(l for l in text.splitlines() if l.startswith(series + "{") and 'phase="reasoning"' in l)
        return float(line.rsplit(" ", 1)[1])

    assert value("dspark_dynamic:confidence_labels_total") == 500
    assert value("dspark_dynamic:confidence_accepted_total") == cal.report.observed
    assert value("dspark_dynamic:confidence_predicted_total") == cal.report.predicted
    assert value("dspark_dynamic:confidence_auc") == cal.report.auc() > 0.8
    assert value("dspark_dynamic:confidence_calibration_error") == cal.report.ece()
    assert 'dspark_dynamic:confidence_auc{engine="0",phase="answer"}' not in text  # no labels there: no series


def test_no_confidence_series_without_a_gating_policy(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    metrics.SnapshotWriter().write(lambda: {"answer": {"steps": 1, "verified": 2, "accepted": 2, "tokens": 3}}, force=True)
    names = {f.name for f in metrics.PhaseCollector(str(tmp_path)).collect()}
    assert not any(n.startswith("dspark_dynamic:confidence") for n in names)


def test_tracked_requests_are_published_when_they_cross_zero_and_periodically(tmp_path, monkeypatch):
    # A server that idles between bursts writes tracked 0 at each idle moment; the first step of
    # a burst and then every WRITE_INTERVAL_S of it must still show the requests in flight.
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    clock = [100.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    writer = metrics.SnapshotWriter()

    def tracked():
        return json.loads(open(writer.path).read())["tracked"]

    def write_at(t, n, force=False):
        clock[0] = t
        before = open(writer.path).read() if os.path.exists(writer.path) else None
        due = writer.due(n)  # the hook's cheap check says what write does
        writer.write(dict, force=force, tracked=n)
        assert force or due == (open(writer.path).read() != before or before is None)
        return tracked()

    assert write_at(100.1, 3) == 3  # busy now: at once
    assert write_at(100.2, 4) == 3  # throttled
    assert write_at(100.4, 0, force=True) == 0  # idle: at once
    assert write_at(100.5, 2) == 2  # busy again: at once
    assert write_at(100.6, 5) == 2  # throttled
    assert write_at(100.0 + metrics.WRITE_INTERVAL_S + 0.05, 6) == 6  # one interval after the last periodic write
    assert write_at(100.0 + 1.5 * metrics.WRITE_INTERVAL_S, 7) == 6  # throttled
    assert write_at(100.0 + 1.6 * metrics.WRITE_INTERVAL_S, 0) == 0  # nothing tracked: at once, unforced too
    writer.remove()


def test_the_live_estimate_is_a_gauge_per_phase_and_alternative(tmp_path, monkeypatch):
    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    estimate = {"reasoning": {"plain": 0.98, "fixed": 1.21}, "all": {"plain": 1.04, "fixed": 1.10}}
    metrics.SnapshotWriter().write(lambda: {"answer": {"steps": 1}}, force=True, estimate=lambda: estimate)
    families = {f.name: f for f in metrics.PhaseCollector(str(tmp_path)).collect()}
    samples = {(s.labels["phase"], s.labels["vs"]): s.value for s in families["dspark_dynamic:estimated_speedup"].samples}
    assert samples == {("reasoning", "plain"): 0.98, ("reasoning", "fixed"): 1.21, ("all", "plain"): 1.04,
                       ("all", "fixed"): 1.10}
    metrics.SnapshotWriter().write(lambda: {"answer": {"steps": 1}}, force=True, estimate=lambda: None)
    assert "dspark_dynamic:estimated_speedup" not in {f.name for f in metrics.PhaseCollector(str(tmp_path)).collect()}


def test_counts_per_request_policy_are_series_of_their_own(tmp_path, monkeypatch):
    from dspark_dynamic.core.phase import Phase
    from dspark_dynamic.core.stats import PhaseStats

    monkeypatch.setenv(metrics.METRICS_DIR_ENV, str(tmp_path))
    stats = PhaseStats(policy_label="adaptive")
    stats.record(Phase.ANSWER, 2, 1, 2, "a")
    stats.record_policy("fixed 2", Phase.ANSWER, 2, 1, 2)
    stats.record(Phase.ANSWER, 1, 1, 2, "b")  # the server's own policy
    stats.record(Phase.REASONING, 0, 0, 1, "c")
    stats.record_policy("fixed 0", Phase.REASONING, 0, 0, 1)
    metrics.SnapshotWriter().write(stats.snapshot, force=True, policies=stats.policy_snapshot)
    families = {f.name: f for f in metrics.PhaseCollector(str(tmp_path)).collect()}
    verified = {(s.labels["policy"], s.labels["phase"]): s.value
                for s in families["dspark_dynamic:policy_verified_draft_tokens"].samples}
    assert verified[("fixed 2", "answer")] == 2 and verified[("adaptive", "answer")] == 1
    assert verified[("fixed 0", "reasoning")] == 0
    tokens = {(s.labels["policy"], s.labels["phase"]): s.value
              for s in families["dspark_dynamic:policy_generated_tokens"].samples}
    assert tokens[("fixed 0", "reasoning")] == 1
    # summed over policies, the per-policy series equal the per-phase ones
    per_phase = {s.labels["phase"]: s.value for s in families["dspark_dynamic:verified_draft_tokens"].samples}
    for phase, total in per_phase.items():
        assert sum(v for (_p, ph), v in verified.items() if ph == phase) == total
    # a malformed per-policy part makes the snapshot unusable, as any other malformed part does
    assert not metrics._valid_snapshot({"phases": {}, "policies": {"fixed 2": {"answer": {"verified": "x"}}}})
