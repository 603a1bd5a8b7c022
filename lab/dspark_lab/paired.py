"""Paired, interleaved wall-clock comparisons: the wheel's ``dspark_dynamic.tools.paired``.

The helpers live in the wheel because ``dspark-dynamic-bench --policies`` needs them; the
laboratory's benchmarks keep importing them from here.
"""

from dspark_dynamic.tools.paired import Summary, paired_ratio, rotation, summarize

__all__ = ["Summary", "paired_ratio", "rotation", "summarize"]
