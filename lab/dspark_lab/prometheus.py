"""A real Prometheus scraping a server's ``/metrics``, and the Grafana dashboard's queries on it.

``Prometheus`` runs the ``prometheus`` binary (Debian's package; ``scripts/install_prometheus.sh``
installs it) as a child process on 127.0.0.1: a config of its own with one scrape job, its
TSDB in a temporary directory, a free port; never a system service.  ``panel_queries`` reads
every panel's PromQL from ``src/dspark_dynamic/data/grafana/dspark_dynamic.json`` with Grafana's variables bound
(``$engine``: every engine, ``$__rate_interval``: a window given), so a test can evaluate
exactly what the dashboard shows.  ``draw`` plots the main panels over a time range
(``scripts/dashboard_snapshot.py`` makes ``docs/dashboard.png`` with it).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from dspark_dynamic.tools.data import dashboard
from dspark_lab.serve import free_port

DASHBOARD = dashboard()
MAIN_PANELS = (1, 2, 3, 5)  # acceptance, mean depth, steps by depth, tokens per step


def binary() -> str | None:
    """The ``prometheus`` executable on PATH, or None."""
    return shutil.which("prometheus")


class Prometheus:
    """``prometheus`` scraping ``target`` (host:port) every ``interval_s``; a context manager."""

    def __init__(self, target: str, interval_s: float = 1.0, log_path: Path | None = None) -> None:
        exe = binary()
        if exe is None:
            raise RuntimeError("no 'prometheus' on PATH: apt-get install -y prometheus (scripts/setup_env.sh does)")
        self.dir = Path(tempfile.mkdtemp(prefix="dspark-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        interval = f"{int(interval_s * 1000)}ms"
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: ['{target}']\n")
        self.cmd = [exe, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d"]
        self.log_path = log_path or self.dir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Prometheus":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=2)
                return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"prometheus did not start; log:\n{Path(self.log_path).read_text()[-3000:]}")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _get(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector at now: ``[{"metric": labels, "value": [t, "v"]}, ...]``."""
        return self._get("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self._get("query_range", query=expr, start=start, end=end, step=step)["result"]

    def scraped(self) -> int:
        """Samples of the scrape job so far (``up`` points of the target)."""
        result = self.query("count_over_time(up[1h])")
        return int(float(result[0]["value"][1])) if result else 0

    def wait_scrapes(self, more: int, timeout: float = 60.0) -> int:
        """Wait until ``more`` scrapes beyond the present count have happened (a rate needs
        scrapes before and during the traffic); returns the count reached."""
        goal = self.scraped() + more
        deadline = time.monotonic() + timeout
        while (n := self.scraped()) < goal and time.monotonic() < deadline:
            time.sleep(0.5)
        return n


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def bind(expr: str, rate_window: str) -> str:
    """A panel's PromQL with the dashboard's variables bound: every engine, ``rate_window``."""
    return expr.replace("$__rate_interval", rate_window).replace('"$engine"', '".*"')


def panel_queries(dashboard: dict[str, Any], rate_window: str = "1m") -> list[tuple[str, str]]:
    """(panel title / refId, bound PromQL) for every target of every panel."""
    return [(f"{panel['title']} / {target['refId']}", bind(target["expr"], rate_window))
            for panel in dashboard["panels"] for target in panel.get("targets", ())]


def legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def draw(prom: Prometheus, dashboard: dict[str, Any], out: Path, start: float, end: float,
         rate_window: str = "30s", panels: tuple[int, ...] = MAIN_PANELS) -> Path:
    """Plot ``panels`` (by id) of ``dashboard`` from ``prom`` over ``[start, end]`` into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [p for p in dashboard["panels"] if p["id"] in panels]
    cols = 2
    rows = (len(chosen) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.4 * rows), squeeze=False)
    step = max(1.0, (end - start) / 200)
    for ax, panel in zip(axes.flat, chosen):
        for target in panel["targets"]:
            for series in prom.query_range(bind(target["expr"], rate_window), start, end, step):
                points = [(float(t) - start, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, ys, label=legend(target.get("legendFormat", ""), series["metric"]))
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("seconds")
        if panel["fieldConfig"]["defaults"].get("unit") == "percentunit":
            ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']} (Prometheus, rate over {rate_window})", fontsize=11)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
