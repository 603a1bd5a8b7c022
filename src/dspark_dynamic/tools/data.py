"""The files the wheel ships for users: launch presets and the Grafana dashboard.

A preset is a vLLM ``--config`` YAML, ``data/presets/NAME.yaml``, with an optional environment
file beside it, ``NAME.env``.  The YAML's first comment lines describe it.  Everything here reads
package data through ``importlib.resources``, so it works from a plain ``pip install``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

_DATA = "dspark_dynamic.data"


@dataclass(frozen=True)
class Preset:
    name: str
    config: Path
    env: Path | None

    @property
    def summary(self) -> str:
        """The YAML's first comment line, without its ``#``."""
        for line in self.config.read_text().splitlines():
            if line.startswith("#"):
                return line.lstrip("#").strip()
        return ""


def _folder(*parts: str) -> Path:
    return Path(str(resources.files(_DATA).joinpath(*parts)))


def presets() -> dict[str, Preset]:
    """Every shipped preset by name, sorted."""
    out: dict[str, Preset] = {}
    for config in sorted(_folder("presets").glob("*.yaml")):
        env = config.with_suffix(".env")
        out[config.stem] = Preset(config.stem, config, env if env.is_file() else None)
    return out


def preset(name: str) -> Preset:
    """The preset called ``name``; KeyError naming the known ones otherwise."""
    known = presets()
    if name not in known:
        raise KeyError(f"no preset {name!r}; known: {', '.join(known) or 'none'}")
    return known[name]


def dashboard() -> Path:
    """The Grafana dashboard JSON (import it in Grafana: Dashboards -> New -> Import)."""
    return _folder("grafana", "dspark_dynamic.json")


def copy_out(paths: list[Path], folder: str) -> list[Path]:
    """Copy ``paths`` into ``folder`` (created), refusing to overwrite; returns the copies."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    copies = [target / p.name for p in paths]
    existing = [str(c) for c in copies if c.exists()]
    if existing:
        raise FileExistsError(f"{', '.join(existing)} exists (remove it or choose another folder)")
    for source, copy in zip(paths, copies):
        shutil.copyfile(source, copy)
    return copies
