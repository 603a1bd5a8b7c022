"""The wheel is the plugin: what it ships, and that it works from a plain install with no checkout.

The wheel is built from this tree and its file list compared with an allow-list, so a module
added to the package is a decision (add it below) and nothing of the laboratory (``lab/``) can
ride along.  A fresh venv outside the repo gets the wheel alone; vLLM reaches it the way a user's
environment has it already: the development venv's site-packages as one plain path entry, whose
``.pth`` files (the editable installs of this repo) Python does not run, so ``dspark_dynamic``
comes only from the wheel and ``dspark_lab`` not at all.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Every file the wheel may hold besides its .dist-info: the runtime (plugin, core, adapter,
# fixes), the user tools (launcher, doctor, benchmark client) and their package data.
ALLOWED = {
    "dspark_dynamic/__init__.py",
    "dspark_dynamic/adapter/__init__.py",
    "dspark_dynamic/adapter/build.py",
    "dspark_dynamic/adapter/fail_open.py",
    "dspark_dynamic/adapter/markers.py",
    "dspark_dynamic/adapter/metrics.py",
    "dspark_dynamic/adapter/patches/__init__.py",
    "dspark_dynamic/adapter/patches/check.py",
    "dspark_dynamic/adapter/patches/confidence.py",
    "dspark_dynamic/adapter/patches/confidence_v2.py",
    "dspark_dynamic/adapter/patches/config_alias.py",
    "dspark_dynamic/adapter/patches/cudagraph.py",
    "dspark_dynamic/adapter/patches/dflash_context.py",
    "dspark_dynamic/adapter/patches/drafter_skip.py",
    "dspark_dynamic/adapter/patches/plain_step.py",
    "dspark_dynamic/adapter/patches/request_policy.py",
    "dspark_dynamic/adapter/patches/scheduler.py",
    "dspark_dynamic/adapter/patches/zero_draft_sampling.py",
    "dspark_dynamic/adapter/patching.py",
    "dspark_dynamic/adapter/plugin.py",
    "dspark_dynamic/adapter/reasoning_parsers.py",
    "dspark_dynamic/core/__init__.py",
    "dspark_dynamic/core/acceptance.py",
    "dspark_dynamic/core/adaptive.py",
    "dspark_dynamic/core/confidence.py",
    "dspark_dynamic/core/controller.py",
    "dspark_dynamic/core/costs.py",
    "dspark_dynamic/core/decide.py",
    "dspark_dynamic/core/drafter_lag.py",
    "dspark_dynamic/core/draws.py",
    "dspark_dynamic/core/estimate.py",
    "dspark_dynamic/core/live.py",
    "dspark_dynamic/core/options.py",
    "dspark_dynamic/core/peers.py",
    "dspark_dynamic/core/phase.py",
    "dspark_dynamic/core/policy.py",
    "dspark_dynamic/core/request_policy.py",
    "dspark_dynamic/core/stats.py",
    "dspark_dynamic/data/__init__.py",
    "dspark_dynamic/data/grafana/dspark_dynamic.json",
    "dspark_dynamic/data/presets/deepseek-v4-flash-lvllm.env",
    "dspark_dynamic/data/presets/deepseek-v4-flash-lvllm.yaml",
    "dspark_dynamic/data/presets/deepseek-v4-flash-vllm033.yaml",
    "dspark_dynamic/fixes/__init__.py",
    "dspark_dynamic/fixes/flashinfer_cudart.py",
    "dspark_dynamic/tools/__init__.py",
    "dspark_dynamic/tools/bench_client.py",
    "dspark_dynamic/tools/bench_policies.py",
    "dspark_dynamic/tools/data.py",
    "dspark_dynamic/tools/doctor.py",
    "dspark_dynamic/tools/launch.py",
    "dspark_dynamic/tools/live_check.py",
    "dspark_dynamic/tools/paired.py",
    "dspark_dynamic/tools/plot_policies.py",
}
DIST_INFO = {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt", "licenses/LICENSE"}
# Modules that exist for tests and benchmarks only: none may be imported by the installed plugin.
TEST_MODULES = ("dspark_lab", "pytest", "_pytest", "tests")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of what the wheel is made of, so no stale ``build/`` output rides along."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = out.glob("dspark_dynamic-*.whl")
    return built


def test_the_wheel_holds_the_allowed_files_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    dist_info = {n.split("/", 1)[1] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    package = {n for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert package - ALLOWED == set(), "files the allow-list does not name (add them on purpose, or keep them out)"
    assert ALLOWED - package == set(), "allowed files missing from the wheel"
    assert dist_info == DIST_INFO


def test_the_wheels_metadata(wheel):
    import dspark_dynamic

    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
        entry_points = z.read(meta_name.replace("METADATA", "entry_points.txt")).decode()
    assert meta["Version"] == dspark_dynamic.__version__  # one source: the package's __version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert "License :: " not in str(meta.get_all("Classifier"))  # the expression, not a legacy classifier
    assert [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r] == []
    for line in ("dspark_dynamic = dspark_dynamic:register",
                 "dspark_dynamic = dspark_dynamic.adapter.metrics:PhaseMetricsLogger",
                 "dspark-dynamic-launch = dspark_dynamic.tools.launch:main",
                 "dspark-dynamic-doctor = dspark_dynamic.tools.doctor:main",
                 "dspark-dynamic-bench = dspark_dynamic.tools.bench_client:main"):
        assert line in entry_points


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A venv outside the repo with the wheel installed and vLLM on its path (no checkout)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    (Path(fresh_site) / "host_vllm.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def run_fresh(venv: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_PLUGINS")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return subprocess.run(list(args), capture_output=True, text=True, env=env, cwd=venv.parent, timeout=300)


def test_the_fresh_venv_imports_the_plugin_from_the_wheel_alone(fresh_venv):
    proc = run_fresh(fresh_venv, str(fresh_venv / "bin" / "python"), "-c",
                     "import importlib.util, dspark_dynamic, vllm; print(dspark_dynamic.__file__);"
                     " print(importlib.util.find_spec('dspark_lab'))")
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, lab = proc.stdout.split()
    assert Path(where).is_relative_to(fresh_venv) and not Path(where).is_relative_to(ROOT)
    assert lab == "None"


def test_the_seed_preset_dry_run_from_a_plain_install(fresh_venv):
    proc = run_fresh(fresh_venv, str(fresh_venv / "bin" / "dspark-dynamic-launch"),
                     "--preset", "deepseek-v4-flash-lvllm", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "plugin dspark_dynamic installed and loaded" in lines[0]
    assert "export LK_THREADS=16" in lines
    config = lines[-1].split("--config ", 1)[1]
    assert Path(config).is_relative_to(fresh_venv) and config.endswith("data/presets/deepseek-v4-flash-lvllm.yaml")


def test_the_doctor_runs_from_a_plain_install(fresh_venv):
    proc = run_fresh(fresh_venv, str(fresh_venv / "bin" / "dspark-dynamic-doctor"), "--preset", "deepseek-v4-flash-lvllm")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "sync" in proc.stdout


IMPORT_ALL = f"""
import importlib, pkgutil, sys
import dspark_dynamic
for info in pkgutil.walk_packages(dspark_dynamic.__path__, "dspark_dynamic."):
    importlib.import_module(info.name)
import vllm.plugins
loaded = vllm.plugins.load_plugins_by_group("vllm.general_plugins")
assert "dspark_dynamic" in loaded, loaded
bad = sorted(m for m in sys.modules if m.split(".")[0] in {TEST_MODULES!r})
print(len(sys.modules), bad)
"""


def test_importing_the_installed_plugin_imports_no_test_module(fresh_venv):
    proc = run_fresh(fresh_venv, str(fresh_venv / "bin" / "python"), "-c", IMPORT_ALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split(maxsplit=1)[1].strip() == "[]"


def test_importing_the_plugin_imports_no_test_module_where_the_lab_is_installed():
    """The development venv has dspark_lab importable; the plugin still never reaches for it."""
    assert site.getsitepackages()  # the premise: a real environment, as a user's
    import importlib.util

    assert importlib.util.find_spec("dspark_lab") is not None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, env=env,
                          cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split(maxsplit=1)[1].strip() == "[]"
