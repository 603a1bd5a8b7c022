import json

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
