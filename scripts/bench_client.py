#!/usr/bin/env python3
"""Phase-split benchmark client (same as the ``dspark-dynamic-bench`` console command)."""

import sys

from dspark_dynamic.tools.bench_client import main

if __name__ == "__main__":
    sys.exit(main())
