"""Default boot-to-boot bands: how far one boot's mean of a metric sits from its arm's level, per metric
family and platform, measured from committed multi-boot runs (``benchmarks/noise_bands.py`` writes
``pytest_kvcache/data/noise_bands.json``; docs/gates.md says where each figure comes from).

A within-boot CI cannot see the next boot. With fewer than 3 boots per arm a gate (and a delta's verdict)
is judged on its within-boot CI widened by a boot-to-boot spread; ``report.spread`` says which (this band, the
run's own boots, a stored A/A or the widest spread measured on any host). Reads data only; no pytest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model import Evidence

Platform = Literal["cpu", "gpu"]

#: Metric families: metrics whose boot-to-boot spread is alike (each metric's ``family`` in the catalogue,
#: ``metrics.catalogue``; a metric registered later is read there by :func:`family`).
FAMILIES: dict[str, tuple[str, ...]] = catalogue.families()
FILE = "noise_bands.json"
#: The families a metric of unknown kind may be: its band is the widest of theirs.
TIMING = ("decode rate", "latency", "prefill rate")


def family(metric: str) -> str | None:
    """The family of a metric: as the catalogue declares it, else by its unit (``*_tps`` a rate, ``*_s`` a
    time); None: unknown."""
    return catalogue.family(metric)


def platform_of(evidence: Mapping[str, Evidence]) -> Platform:
    """A run is GPU when any boot's evidence saw a GPU (NVML before the boot), else CPU."""
    return "gpu" if any((e.get("gpu_before") or {}).get("gpu") for e in evidence.values()) else "cpu"


@dataclass(frozen=True)
class Band:
    """One family's band on one platform: the standard deviation of log(boot mean) (``boot_sd``, a share)."""

    platform: Platform
    family: str
    boot_sd: float
    source: str

    @property
    def one_boot_pct(self) -> float:
        """The 95% half-width (percent) the band adds to a ratio of one boot against one boot."""
        return 100 * 1.96 * self.boot_sd * 2**0.5

    def describe(self) -> str:
        return f"the default {self.platform.upper()} {self.family} band (boot-to-boot SD {self.boot_sd * 100:.1f}%)"


@cache
def _table() -> dict[str, Any]:
    text = resources.files("pytest_kvcache").joinpath("data", FILE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def table() -> dict[str, Any]:
    """``noise_bands.json`` as written by ``benchmarks/noise_bands.py``."""
    return _table()


def band(metric: str, platform: Platform) -> Band | None:
    """The default band of ``metric``'s family on ``platform``; an unknown family gets the platform's widest
    timing band (conservative); None where the table has nothing for the platform."""
    bands = (table().get("platforms") or {}).get(platform) or {}
    if not bands:
        return None
    name = family(metric)
    entry = bands.get(name) if name is not None else None
    if entry is None:
        timing = {k: v for k, v in bands.items() if k in TIMING} or bands
        name, entry = max(timing.items(), key=lambda kv: float(kv[1]["boot_sd"]))
        source = f"{entry['source']}; {metric} has no family of its own: the widest {platform.upper()} band"
        return Band(platform, str(name), float(entry["boot_sd"]), source)
    return Band(platform, str(name), float(entry["boot_sd"]), str(entry["source"]))
