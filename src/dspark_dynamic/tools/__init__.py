"""Tools for users: the launcher and its presets, the doctor, the benchmark client, plots."""
