"""The libcudart lookup rules on odd /proc/self/maps lines (pure, no libraries loaded)."""

import pytest

from dspark_dynamic.fixes import flashinfer_cudart as fix


def line(path: str, addr: str = "7f0000000000-7f0000001000") -> str:
    return f"{addr} r-xp 00000000 08:01 1234                       {path}"


@pytest.mark.parametrize(
    "filename, ok",
    [
        ("libcudart.so", True),
        ("libcudart.so.12", True),
        ("libcudart.so.12.8.90", True),
        ("libcudart-9a3f55d1.so.11.0", True),
        ("libcudart_stub.so", False),  # TileLang <= 0.1.11
        ("libstub_cudart.so", False),  # TileLang >= 0.1.12
        ("libcudart_static.a", False),
        ("libcudart-stub.so", False),
        ("libcudart.stub.so", False),
        ("libcudart.so.12 (deleted)", False),
        ("libcudart_mock.so.12", False),
    ],
)
def test_cudart_filename_rule(filename, ok):
    assert fix.is_library_filename(filename, "libcudart") is ok


def test_other_libraries_keep_extension_module_names():
    assert fix.is_library_filename("cumem_allocator.abi3.so", "cumem_allocator")
    assert not fix.is_library_filename("cumem_allocator_x.so", "cumem_allocator")


def test_mapped_paths_skips_pseudo_deleted_and_anonymous_entries():
    lines = [
        "7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0                          [vdso]",
        "55d000000000-55d000001000 rw-p 00000000 00:00 0                          [heap]",
        "7f0000000000-7f0000001000 rw-p 00000000 00:00 0                          [anon:cuda]",
        "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 ",
        line("/memfd:cuda-ipc (deleted)"),
        line("/old/nvidia/lib/libcudart.so.12 (deleted)"),
        line("/opt/my env/lib/libcudart.so.12"),  # spaces in the path
        line("/opt/my env/lib/libcudart.so.12", "7f0000002000-7f0000003000"),  # second segment
        line("/x/libcudart.so.99/lib/libfoo.so"),  # a directory contains the name
    ]
    assert fix.mapped_paths(lines) == ["/opt/my env/lib/libcudart.so.12", "/x/libcudart.so.99/lib/libfoo.so"]


def test_choose_prefers_the_global_scope_copy_and_checks_symbols():
    paths = [
        "/t/tilelang/lib/libcudart_stub.so",
        "/usr/local/cuda/lib64/libcudart.so.12.4.1",
        "/venv/nvidia/cuda_runtime/lib/libcudart.so.12",
        "/venv/torch/lib/libcudart-abcdef12.so.11.0",
    ]
    everything = lambda p: True  # noqa: E731
    assert fix.choose_cudart(paths, "/venv/nvidia/cuda_runtime/lib/libcudart.so.12", everything) == paths[2]
    assert fix.choose_cudart(paths, None, everything) == paths[1]  # map order among real copies
    # the preferred copy lacks a symbol: fall back to the next real one that has them all
    assert fix.choose_cudart(paths, paths[2], lambda p: p != paths[2]) == paths[1]
    assert fix.choose_cudart(paths[:1], None, everything) is None  # only a stub: "not loaded"


def test_behaviour_check_on_known_rules():
    def substring_rule(lib_name):  # FlashInfer <= 0.7.0 / b12x
        with open("/proc/self/maps") as f:
            for entry in f:
                if lib_name in entry:
                    return entry[entry.index("/"):].strip()
        return None

    def filename_rule(lib_name):  # vLLM >= 0.32 / the fork
        with open("/proc/self/maps") as f:
            for entry in f:
                start = entry.find("/")
                if start == -1:
                    continue
                path = entry[start:].strip()
                if path.rsplit("/", 1)[-1].startswith((f"{lib_name}.", f"{lib_name}-")):
                    return path
        return None

    def raises(lib_name):
        raise AssertionError("Unexpected filename")

    assert fix.misbehaves(substring_rule)
    assert not fix.misbehaves(filename_rule)
    assert fix.misbehaves(raises)
    assert not fix.misbehaves(fix.find_loaded_library)


def test_find_loaded_library_on_this_process_never_raises():
    assert fix.find_loaded_library("libcudart") is None or "libcudart" in fix.find_loaded_library("libcudart")
    assert fix.find_loaded_library("definitely_not_loaded_lib") is None


def test_install_never_raises(monkeypatch):
    import sys
    import types

    def boom(module):
        raise RuntimeError("unexpected")

    monkeypatch.setitem(sys.modules, "flashinfer.comm.cuda_ipc", types.ModuleType("flashinfer.comm.cuda_ipc"))
    monkeypatch.setattr(fix, "_patch_imported", boom)
    monkeypatch.setattr(fix, "_status", {})
    assert isinstance(fix.install(), dict)


def test_a_module_without_the_function_is_skipped(monkeypatch):
    import types

    monkeypatch.setattr(fix, "_status", {})
    fix._patch_imported(types.ModuleType("flashinfer.comm.cuda_ipc"))
    assert fix.status()["modules"]["flashinfer.comm.cuda_ipc"] == "no such function (skipped)"
