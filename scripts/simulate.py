#!/usr/bin/env python3
"""Replay acceptance traces under T(k) = T0 + c_draft*[drafting] + c_first*[k > 0] + d*k and compare policies.

Prints tok/s for fixed k = 0..3, the phase policy, the adaptive policy, a per-step oracle (knows
each step's true acceptance probabilities, as a perfectly calibrated confidence head would) and
the hindsight bound (knows how many drafts each step will accept; unreachable) on
synthetic traces (seed-like, bimodal, drifting, drift: all then no drafts accepted) and on any JSONL trace given with --trace
(per-position rows {"req","phase","L"}, or the controller's own trace_path rows).

    python scripts/simulate.py [--t0-ms 75 --draft-ms 3 --verify-ms 37.75] [--trace FILE]
    python scripts/simulate.py --confidence-auc 0.85   # + gating on them, the peers' rules and the best gate
    python scripts/simulate.py --t0-ms 15.4 --draft-ms 0.9 --verify-ms 7.5 --first-ms 2.7 \
        --confidence-auc 0.94 --max-k 2 --noisy-machine 8   # + costs learned on a noisy machine
    python scripts/simulate.py --dead-spots 24   # only: fresh engines where drafting never pays
    python scripts/simulate.py --context [--steps 3000] [--context-costs seed|testbed]   # only: batches of
        mixed contexts under a step cost with a context term (dspark_lab.simulate_context)
"""

from __future__ import annotations

import argparse

from dspark_lab import simulate_context
from dspark_lab.simulate import CostModel, NoisyMachine, compare, fresh_engine_drafting, replay_learning
from dspark_lab.workloads import (
    ConfidenceModel,
    bimodal_trace,
    draft_features,
    drift_trace,
    drifting_trace,
    load_trace,
    seed_like_trace,
)


def print_table(title: str, results, baseline: str = "fixed k=2") -> None:
    base = next(r for r in results if r.name == baseline).tok_per_s
    phase = next(r for r in results if r.name.startswith("phase")).tok_per_s
    oracle = next((r for r in results if r.name == "oracle per step"), results[-1]).tok_per_s
    hindsight = results[-1].tok_per_s
    print(f"\n== {title}")
    print(f"{'policy':<38} {'tok/s':>7} {'vs k=2':>7} {'vs phase':>8} {'vs oracle':>9} {'vs hindsight':>12} "
          f"{'accept%':>8} {'mean k':>7}")
    for r in results:
        acc = 100.0 * r.accepted / r.verified if r.verified else 0.0
        print(f"{r.name:<38} {r.tok_per_s:>7.2f} {r.tok_per_s / base:>7.3f} {r.tok_per_s / phase:>8.3f} "
              f"{r.tok_per_s / oracle:>9.3f} {r.tok_per_s / hindsight:>12.3f} {acc:>7.1f}% {r.verified / r.steps:>7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    CostModel.add_arguments(ap)
    ap.add_argument("--max-k", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--trace", action="append", default=[], help="JSONL trace file (repeatable)")
    ap.add_argument("--confidence-auc", type=float, default=None,
                    help="also give the drafts confidences of this ROC-AUC: adds the adaptive policy gating on "
                         "them and the peers' rules (vllm-av, freetoken, break-even, p-min)")
    ap.add_argument("--noisy-machine", type=int, default=0, metavar="SEEDS",
                    help="also learn the costs from step times measured on a noisy machine (each request "
                         "0.70-1.42x the cost model's speed, each step 10 %% noise), SEEDS machines per workload: "
                         "adaptive with learned costs against the same policy drafting on every step, and the "
                         "most steps one request ran without drafting")
    ap.add_argument("--dead-spots", type=int, default=0, metavar="SEEDS",
                    help="print only this: SEEDS fresh single-request engines per noise level on a machine where "
                         "drafting never pays (dspark_lab.simulate.fresh_engine_drafting): the steps they drafted on")
    ap.add_argument("--context", action="store_true",
                    help="print only this: batches of 2 and 4 requests of mixed contexts (1k-256k) under the "
                         "seed box's step cost plus a context term: fixed k, phase 1/2, adaptive with context "
                         "features off and on, vLLM-AV profiled at one context, FreeToken's width, the oracle "
                         "(drafts with confidences of --confidence-auc, default 0.85 here)")
    simulate_context.ContextCost.add_arguments(ap)
    ap.add_argument("--steps", type=int, default=3000, help="--context: steps per mix and policy")
    ap.add_argument("--seeds", type=int, default=2, help="--context: traces and noisy machines per mix, pooled")
    ap.add_argument("--drafts", type=int, default=2, help="--context: drafts per step (DSpark's N on the seed box)")
    ap.add_argument("--profile-context", type=int, default=simulate_context.PROFILE_CONTEXT,
                    help="--context: the one context vLLM-AV profiles its costs at (vLLM's default 8192)")
    args = ap.parse_args()
    if args.dead_spots:
        print_dead_spots(args.dead_spots)
        return
    if args.context:
        print_context(args)
        return
    cost = CostModel.from_arguments(args)
    print(f"cost model: T(k) = {cost.t0_ms} + {cost.draft_ms}*[drafting] + {cost.first_ms}*[k > 0] + "
          f"({cost.verify_ms} + {cost.draft_token_ms})*k ms")
    traces = {
        "seed-like (reasoning 40 %, answer 90 % at k=2)": seed_like_trace(args.requests),
        "bimodal reasoning (easy/hard stretches)": bimodal_trace(args.requests),
        "drifting acceptance": drifting_trace(args.requests),
        "drift: 100 % then 0 % within reasoning": drift_trace(args.requests),
    }
    for path in args.trace:
        traces[f"recorded: {path}"] = load_trace(path)
    for title, trace in traces.items():
        features = model = None
        if args.confidence_auc is not None:
            model = ConfidenceModel.with_auc(args.confidence_auc)
            features = draft_features(trace, model, args.max_k)
        print_table(title, compare(trace, cost, max_k=args.max_k, features=features, confidence=model))
        if args.noisy_machine:
            print_noisy(trace, cost, features, args.noisy_machine)


def print_noisy(trace, cost: CostModel, features, seeds: int, n: int = 2) -> None:
    print(f"   learned costs on a noisy machine (k<={n}; adaptive ÷ the same drafting on every step; "
          "most steps one request ran without drafting):")
    ratios = []
    for seed in range(seeds):
        machine = NoisyMachine(seed=100 + seed)
        ours = replay_learning(trace, cost, n, 1, 2, features, machine, seed=seed)
        always = replay_learning(trace, cost, n, 1, 2, features, machine, drafts=n, seed=seed)
        ratios.append(ours.tok_per_s / always.tok_per_s)
        print(f"     machine {seed}: {ours.tok_per_s:7.2f} tok/s, {ratios[-1]:.3f}; most idle {ours.most_idle}")
    print(f"     mean {sum(ratios) / len(ratios):.3f}")


def print_context(args) -> None:
    cost = simulate_context.ContextCost.from_arguments(args)
    c = cost.cost
    auc = 0.85 if args.confidence_auc is None else args.confidence_auc
    print(f"step cost: T = {c.t0_ms} + {cost.request_ms}*(R-1) + {c.draft_ms}*[drafting] + {c.first_ms}*[any k>0] "
          f"+ {cost.ctx_base_ns} ns*sum ctx + sum k_r*({c.verify_ms} ms + {cost.ctx_verify_ns} ns*ctx_r)  "
          f"[{args.context_costs}; N={args.drafts}, confidences AUC {auc}, {args.steps} steps per policy "
          f"and seed, {args.seeds} seeds pooled, noisy machines]")
    summary = []
    for title, names in simulate_context.MIXES.items():
        prompts = [simulate_context.CONTEXTS[name] for name in names]
        results = simulate_context.compare_mix(prompts, cost, args.steps, args.drafts, auc,
                                               profile_context=args.profile_context, seeds=args.seeds)
        print("\n" + simulate_context.table(f"{len(prompts)} requests: {title}", results))
        summary.append((title, *(simulate_context.ratio(results, p) for p in (
            "adaptive, context features on", "adaptive, context features off", "peer: vllm-av",
            "peer: freetoken", "oracle, calibrated, context-blind"))))
    print(f"\n{'÷ oracle':<24} {'adaptive ctx on':>15} {'>= 0.97':>7} {'ctx off':>7} {'vllm-av':>7} "
          f"{'freetoken':>9} {'oracle ctx-blind':>16}")
    for title, on, *others in summary:
        print(f"{title:<24} {on:>15.3f} {'yes' if on >= 0.97 else 'NO':>7} "
              + " ".join(f"{x:>{w}.3f}" for x, w in zip(others, (7, 7, 9, 16))))


def print_dead_spots(seeds: int, steps: int = 1000, early: int = 200) -> None:
    print(f"fresh engines where drafting never pays ({seeds} seeds, {steps} steps each): steps drafted on")
    print(f"{'step noise':>10} {'seeds drafting on >= 40 % of their first ' + str(early):>44} "
          f"{'mean in first ' + str(early):>18} {'mean in all':>12} {'most in all':>12}")
    for noise in (0.0, 0.01, 0.03, 0.10):
        runs = [fresh_engine_drafting(seed, steps, noise, early) for seed in range(seeds)]
        stuck = sum(first >= 0.4 * early for first, _ in runs)
        print(f"{100 * noise:>9.0f}% {stuck:>44} {sum(f for f, _ in runs) / seeds:>18.1f} "
              f"{sum(a for _, a in runs) / seeds:>12.1f} {max(a for _, a in runs):>12}")


if __name__ == "__main__":
    main()
