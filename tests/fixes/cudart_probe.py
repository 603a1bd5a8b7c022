"""Subprocess body for test_flashinfer_real.py (one scenario per process).

argv: LIB_DIR FLASHINFER_ROOT MODULE MODE
  MODE: nofix | fix-before | fix-after
Loads the fake real runtime RTLD_GLOBAL (as torch does), then the stub (as TileLang does), so
the stub is mapped at a lower address; imports MODULE from FLASHINFER_ROOT (the real file from a
FlashInfer wheel, with empty parent packages) and reports which library it bound, as JSON.
"""

import ctypes
import importlib
import json
import sys
import traceback

lib_dir, fi_root, module_name, mode = sys.argv[1:5]
ctypes.CDLL(f"{lib_dir}/real/libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(f"{lib_dir}/tilelang/lib/libcudart_stub.so")
maps = open("/proc/self/maps").read()
order = [p for p in ("libcudart_stub.so", "libcudart.so.12") if p in maps]
stub_first = maps.index("libcudart_stub.so") < maps.index("libcudart.so.12")
sys.path.insert(0, fi_root)

from dspark_dynamic.fixes import flashinfer_cudart as fix  # noqa: E402

report = {"stub_first": stub_first}


def bind():
    module = importlib.import_module(module_name)
    lib = module.CudaRTLibrary()
    report["bound"] = lib.lib._name
    report["error_string"] = lib.funcs["cudaGetErrorString"](0).decode()


if mode == "fix-before":
    fix.install()
try:
    if mode == "fix-after":
        try:
            importlib.import_module(module_name)
            report["first_import"] = "ok"
        except Exception as exc:  # old FlashInfer fails while importing
            report["first_import"] = f"{type(exc).__name__}: {exc}"
        fix.install()
    bind()
except Exception as exc:
    report["error"] = f"{type(exc).__name__}: {exc}"
    report["trace"] = traceback.format_exc()[-1500:]
report["status"] = fix.status()["modules"]
print("PROBE " + json.dumps(report))
