#!/usr/bin/env python3
"""Soak benchmark: thousands of short requests with every kind of ending against `vllm serve`
with the depth controller on (the tiny models, CPU).

Starts ``vllm serve`` (the ``dspark_dynamic`` alias over ``draft_model``, phase draft), warms
up, then sends ``--requests`` completions from ``--concurrency`` clients: cut by max_tokens
(reasoning and answer), read to EOS, cut by stop strings (reasoning and answer) and a stop token,
crossing ``</think>``, streams the client closes early (aborts), ``n`` = 2 or 3.  Prints, at the
start and the end, each engine core's RSS and the controller's tracked state
(``dspark_dynamic:tracked_requests``), the tracked requests seen in flight next to vLLM's
running requests, plus requests per second and whether the per-phase series still sum to vLLM's
counters per engine.  A progress bar (stderr) shows the requests done, the ETA, the wrong
outputs and the tracked requests so far.  Exit 1 when an output is wrong, the tracked state
does not return to zero (the leak check), the counts disagree, or no tracked request was seen
while vLLM ran some.

    python scripts/soak.py [--requests 3000 --concurrency 16] [--json out.json]
    python scripts/soak.py --serve-args="--data-parallel-size 2"    # a layout (two engine cores)
    python scripts/soak.py --no-controller                          # baseline: plain vLLM draft_model
    python scripts/soak.py --base-url http://127.0.0.1:8000 --engine-pid 1234   # a running server
    python scripts/soak.py --requests 40 --serve-args="--reasoning-parser-plugin dspark_lab.leaky_controller"
                                                                    # the leak check failing on a leak
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=100, help="requests sent first, before the start figures")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--serve-args", default="", help="extra `vllm serve` arguments (one string)")
    ap.add_argument("--base-url", help="use this running server instead of starting one (tiny models, "
                                       "served as 'tiny')")
    ap.add_argument("--engine-pid", type=int, action="append", default=[],
                    help="with --base-url: an engine-core pid whose RSS to report (repeatable)")
    ap.add_argument("--no-controller", action="store_true",
                    help="a baseline: plain vLLM draft_model, the plugin not configured (RSS comparison)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args(argv)

    from dspark_dynamic.adapter.plugin import require_vllm
    from dspark_lab import soak
    from dspark_lab.serve import TinyServer, rss_bytes

    require_vllm()

    def log(line: str) -> None:
        print(line, flush=True)

    if args.base_url:
        pids = {f"engine-core-{pid}": pid for pid in args.engine_pid}
        report = soak.run_soak(args.base_url.rstrip("/"), args.requests, args.concurrency, args.seed, args.warmup,
                               rss=lambda: {k: rss_bytes(p) for k, p in pids.items()}, log=log, progress=True)
    else:
        from dspark_lab import tiny_models
        from dspark_lab.scenarios import SCRIPT

        target, draft = str(tiny_models.build_target(SCRIPT)), str(tiny_models.build_phase_draft(SCRIPT))
        log_path = Path(tempfile.mkdtemp(prefix="dspark-soak-")) / "serve.log"
        extra = shlex.split(args.serve_args)
        log(f"starting vllm serve {' '.join(extra)} (log: {log_path})")
        with TinyServer(target, draft, log_path, extra_args=extra, max_num_seqs=args.max_num_seqs,
                        controller=not args.no_controller) as server:
            pids = server.engine_core_pids()
            log(f"up after {server.start_s:.0f} s; engine cores: {pids}")
            report = soak.run_soak(server.url, args.requests, args.concurrency, args.seed, args.warmup,
                                   scrape=server.scrape, rss=lambda: {k: rss_bytes(p) for k, p in pids.items()},
                                   log=log, progress=True)
            report["serve_args"] = extra
            report["controller"] = not args.no_controller
    print(soak.format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    failed = soak.failed_checks(report, controller=not args.no_controller)
    for why in failed:
        print(f"FAILED: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
