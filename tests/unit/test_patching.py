import sys
import types

import pytest

from dspark_dynamic.adapter.patching import Patch, PatchTargetError, on_import


def _module(name):
    mod = types.ModuleType(name)

    class Target:
        def method(self, x, y=1):
            return ("orig", x, y)

    mod.Target = Target
    sys.modules[name] = mod
    return mod


def _wrap(original):
    def method(self, x, y=1):
        return ("patched",) + original(self, x, y)

    return method


def test_apply_once_and_revert():
    mod = _module("dd_fake_mod_a")
    patch = Patch("fake", "dd_fake_mod_a", "Target.method", _wrap, params=("x",))
    assert patch.apply() and patch.apply()
    assert mod.Target().method(3) == ("patched", "orig", 3, 1)  # wrapped exactly once
    patch.revert()
    assert mod.Target().method(3) == ("orig", 3, 1)


def test_second_patch_object_for_same_target_refuses_to_double_wrap():
    mod = _module("dd_fake_mod_b")
    Patch("fake", "dd_fake_mod_b", "Target.method", _wrap).apply()
    Patch("fake", "dd_fake_mod_b", "Target.method", _wrap).apply()
    assert mod.Target().method(1) == ("patched", "orig", 1, 1)


def test_missing_target_fails_only_when_strict():
    _module("dd_fake_mod_c")
    patch = Patch("fake", "dd_fake_mod_c", "Target.gone", _wrap)
    assert patch.apply() is False
    assert patch.state.startswith("unavailable")
    with pytest.raises(PatchTargetError, match="cannot be applied on"):
        patch.apply(strict=True)


def test_signature_mismatch_is_detected():
    _module("dd_fake_mod_d")
    patch = Patch("fake", "dd_fake_mod_d", "Target.method", _wrap, params=("z",))
    with pytest.raises(PatchTargetError, match="lacks parameters"):
        patch.apply(strict=True)


def test_post_import_hook_runs_after_first_import(tmp_path, monkeypatch):
    (tmp_path / "dd_lazy_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    on_import("dd_lazy_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    import dd_lazy_mod  # noqa: F401

    assert seen == [1]
    on_import("dd_lazy_mod", lambda m: seen.append(2))  # already imported: runs at once
    assert seen == [1, 2]
