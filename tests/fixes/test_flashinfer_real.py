"""The fix against real FlashInfer source files and real (fake-CUDA) shared libraries.

Two libraries are built with the system C compiler: a "real" ``libcudart.so.12`` that exports
everything FlashInfer binds, and TileLang-style ``libcudart_stub.so`` without
``cudaDeviceReset``.  Each scenario runs in a fresh process that maps the stub at a lower
address than the real runtime, then imports FlashInfer's own ``cuda_ipc.py`` (0.6.12, the
version the Lvllm fork pins, and 0.7.4) from the wheel, with empty parent packages so the rest
of FlashInfer is never imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dspark_dynamic.fixes.flashinfer_cudart import REQUIRED_SYMBOLS

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("DSPARK_DYNAMIC_FLASHINFER_WHEELS", ROOT / ".venv" / ".wheels"))
COMM = "flashinfer.comm.cuda_ipc"
B12X = "flashinfer.experimental.b12x.comm.pcie._cuda_ipc"


def _c_source(symbols, tag):
    funcs = "\n".join(f"int {s}(void) {{ return 0; }}" for s in symbols if s != "cudaGetErrorString")
    return f'{funcs}\nconst char *cudaGetErrorString(int e) {{ return "{tag}"; }}\n'


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("a C compiler (cc) is needed to build the fake CUDA runtimes")
    root = tmp_path_factory.mktemp("libs")
    builds = {
        root / "real" / "libcudart.so.12": _c_source(REQUIRED_SYMBOLS, "real"),
        root / "tilelang" / "lib" / "libcudart_stub.so": _c_source(
            [s for s in REQUIRED_SYMBOLS if s != "cudaDeviceReset"], "stub"
        ),
    }
    for out, src in builds.items():
        out.parent.mkdir(parents=True, exist_ok=True)
        c_file = out.with_suffix(".c")
        c_file.write_text(src)
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(c_file)], check=True)
    return root


def _extract(version: str, dest: Path) -> Path:
    wheels = sorted(WHEELS.glob(f"flashinfer_python-{version}-*.whl"))
    if not wheels:
        pytest.fail(f"FlashInfer {version} wheel not found in {WHEELS}; run scripts/setup_env.sh")
    with zipfile.ZipFile(wheels[0]) as zf:
        for module in (COMM, B12X):
            member = module.replace(".", "/") + ".py"
            if member not in zf.namelist():
                continue
            target = dest / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(member))
            for parent in target.relative_to(dest).parents:
                if str(parent) != ".":
                    (dest / parent / "__init__.py").touch()
    return dest


@pytest.fixture(scope="module")
def flashinfer_trees(tmp_path_factory):
    return {v: _extract(v, tmp_path_factory.mktemp(f"fi-{v}")) for v in ("0.6.12", "0.7.4")}


def probe(libs: Path, tree: Path, module: str, mode: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("cudart_probe.py")), str(libs), str(tree), module, mode],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DSPARK_DYNAMIC_CUDART_FIX": "1"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(lines[-1][len("PROBE "):])
    assert report["stub_first"], "precondition: the stub must be mapped before the real runtime"
    return report


def test_old_flashinfer_binds_the_stub_without_the_fix(libs, flashinfer_trees):
    report = probe(libs, flashinfer_trees["0.6.12"], COMM, "nofix")
    assert "cudaDeviceReset" in report["error"]  # the user's crash, reproduced


@pytest.mark.parametrize("mode", ["fix-before", "fix-after"])
def test_old_flashinfer_binds_the_real_runtime_with_the_fix(libs, flashinfer_trees, mode):
    report = probe(libs, flashinfer_trees["0.6.12"], COMM, mode)
    assert "error" not in report, report
    assert report["bound"].endswith("/real/libcudart.so.12")
    assert report["error_string"] == "real"
    if mode == "fix-after":
        assert "cudaDeviceReset" in report["first_import"]  # it had failed before the fix
    assert report["status"][COMM] == "pre-exec (source rewrite)"


def test_current_flashinfer_comm_is_left_alone(libs, flashinfer_trees):
    for mode in ("nofix", "fix-before"):
        report = probe(libs, flashinfer_trees["0.7.4"], COMM, mode)
        assert report["bound"].endswith("/real/libcudart.so.12"), report
    assert report["status"][COMM] == "upstream-ok (kept)"


def test_current_flashinfer_b12x_binds_the_stub_without_the_fix(libs, flashinfer_trees):
    report = probe(libs, flashinfer_trees["0.7.4"], B12X, "nofix")
    assert report["bound"].endswith("libcudart_stub.so")


@pytest.mark.parametrize("mode, how", [("fix-before", "pre-exec (source rewrite)"),
                                       ("fix-after", "post-hoc (already imported)")])
def test_current_flashinfer_b12x_with_the_fix(libs, flashinfer_trees, mode, how):
    report = probe(libs, flashinfer_trees["0.7.4"], B12X, mode)
    assert report["bound"].endswith("/real/libcudart.so.12"), report
    assert report["status"][B12X] == how


def test_switched_off_by_environment(monkeypatch):
    from dspark_dynamic.fixes import flashinfer_cudart as fix

    monkeypatch.setenv(fix.ENV_SWITCH, "0")
    assert fix.install()["enabled"] is False
