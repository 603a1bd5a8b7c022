"""The Grafana dashboard (src/dspark_dynamic/data/grafana/dspark_dynamic.json) against a real Prometheus scraping a
real `vllm serve`: every panel's PromQL returns series from the running server.

Prometheus is Debian's ``prometheus`` (``scripts/install_prometheus.sh`` installs it where it can), run here as a child
process with its own config and TSDB directory.  ``--dtype float32``: see test_soak_checks.py.
"""

from __future__ import annotations

import math
import time

import pytest

from dspark_lab import prometheus, soak
from dspark_lab.serve import TinyServer

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def scraped(target, phase_draft, tmp_path_factory):
    if prometheus.binary() is None:
        pytest.skip("no 'prometheus' on PATH (apt-get install -y prometheus; scripts/install_prometheus.sh installs it as root)")
    tmp = tmp_path_factory.mktemp("dashboard")
    # the adaptive policy: its live estimate (dspark_dynamic:estimated_speedup) is a panel too
    controller = {"policy": "adaptive", "reasoning_depth": 1, "answer_depth": 2}
    with TinyServer(target, phase_draft, tmp / "serve.log", extra_args=["--dtype", "float32"], max_num_seqs=8,
                    controller=controller) as server:
        with prometheus.Prometheus(server.url.removeprefix("http://"), log_path=tmp / "prometheus.log") as prom:
            prom.wait_scrapes(2)  # the counters' values before the traffic
            start = time.time()
            report = soak.run_soak(server.url, requests=240, concurrency=8, warmup=0, scrape=server.scrape)
            prom.wait_scrapes(3)  # and after it
            yield prom, report, start, time.time()


def test_every_panel_query_returns_series(scraped):
    prom, report, _, _ = scraped
    assert report["wrong"] == 0
    scrapes = prom.scraped()
    assert scrapes >= 4, f"prometheus scraped the server only {scrapes} times"
    dashboard = prometheus.load_dashboard()
    queries = prometheus.panel_queries(dashboard, rate_window="1m")
    assert len(queries) >= len(dashboard["panels"]) >= 9
    empty = [name for name, expr in queries if not prom.query(expr)]
    assert not empty, f"panels whose query returned no series: {empty}"
    for name, expr in queries:  # and numbers, not only NaN from an idle window
        values = [float(s["value"][1]) for s in prom.query(expr)]
        assert any(math.isfinite(v) for v in values), (name, expr, values)
    # the series carry both phases, per engine
    phases = {s["metric"].get("phase") for s in prom.query(queries[0][1])}
    assert phases == {"reasoning", "answer"}


def test_the_main_panels_draw_from_prometheus(scraped, tmp_path):
    prom, _, start, end = scraped
    out = prometheus.draw(prom, prometheus.load_dashboard(), tmp_path / "dashboard.png", start, end)
    assert out.stat().st_size > 10_000
