import json

from dspark_dynamic import metrics


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
