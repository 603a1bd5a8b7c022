"""The entry point, the patches it declares, and that an unconfigured plugin changes nothing."""

import importlib.metadata
import subprocess
import sys

import pytest

pytest.importorskip("vllm")


def test_entry_point_is_declared():
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    (ep,) = [ep for ep in eps if ep.name == "dspark_dynamic"]
    assert ep.value == "dspark_dynamic:register"


def test_load_general_plugins_registers_the_patches():
    code = (
        "import vllm.plugins as p; p.load_general_plugins();"
        "import vllm.v1.core.sched.scheduler as s, vllm.engine.arg_utils as a;"
        "print(getattr(s.Scheduler.schedule, '__dspark_dynamic_patch__', None),"
        "getattr(a.EngineArgs.create_speculative_config, '__dspark_dynamic_patch__', None))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["scheduler-schedule", "engine-args-speculative-config"]


def test_vllm_plugins_filter_excludes_it():
    code = (
        "import vllm.plugins as p; p.load_general_plugins();"
        "import vllm.v1.core.sched.scheduler as s;"
        "print(hasattr(s.Scheduler.schedule, '__dspark_dynamic_patch__'))"
    )
    env = {**__import__("os").environ, "VLLM_PLUGINS": "some_other_plugin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split()[-1] == "False"


def test_register_is_idempotent_and_never_raises(monkeypatch):
    import dspark_dynamic.adapter.plugin as plugin

    plugin.register()
    before = plugin.status()
    plugin.register()
    assert plugin.status() == before

    def boom():
        raise RuntimeError("broken patch table")

    monkeypatch.setattr(plugin, "_registered_pid", None)
    monkeypatch.setattr(plugin, "all_patches", boom)
    plugin.register()  # logs, does not raise


def test_require_vllm_reports_version():
    from dspark_dynamic.adapter.plugin import require_vllm

    assert require_vllm()


def test_plugin_installs_the_cudart_fix_and_keeps_vllms_fixed_lookup():
    code = (
        "import vllm.plugins as p; p.load_general_plugins();"
        "import vllm.distributed.device_communicators.cuda_wrapper;"
        "from dspark_dynamic.fixes import flashinfer_cudart as f; import json; print(json.dumps(f.status()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    status = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert status["finder_installed"] is True
    # vLLM 0.32 already matches file names: detected by behaviour and left alone
    assert status["modules"]["vllm.utils.system_utils"] == "upstream-ok (kept)"


def test_gpu_verification_script_refuses_clearly_without_a_gpu():
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "verify_gpu.py"
    proc = subprocess.run([sys.executable, str(script), "--model", "/nonexistent"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "no CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_every_patch_target_exists_in_this_vllm():
    from dspark_dynamic.adapter.patches.check import problems

    assert problems() == {name: None for name in problems()}
