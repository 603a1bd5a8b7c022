#!/usr/bin/env bash
# Set up the CPU environment (if needed) and run the demo on the tiny models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python scripts/demo.py "$@"
