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
from pytest_kvcache.model.evidence import Evidence

Platform = Literal["cpu", "gpu"]

#: Metric families: metrics whose boot-to-boot spread is alike (each metric's ``family`` in the catalogue,
#: ``metrics.catalogue``; a metric registered later is read there by :func:`family`).
FAMILIES: dict[str, tuple[str, ...]] = catalogue.families()
FILE = "noise_bands.json"
#: The families a metric of unknown kind may be: its band is the widest of theirs.
TIMING = ("decode rate", "latency", "prefill rate")


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

    def describe(self) -> str:
        return f"the default {self.platform.upper()} {self.family} band (boot-to-boot SD {self.boot_sd * 100:.1f}%)"


@cache
def table() -> dict[str, Any]:
    """``noise_bands.json`` as written by ``benchmarks/noise_bands.py``."""
    data: dict[str, Any] = json.loads(resources.files("pytest_kvcache").joinpath("data", FILE).read_text("utf-8"))
    return data


def band(metric: str, platform: Platform) -> Band | None:
    """The default band of ``metric``'s family on ``platform``; an unknown family gets the platform's widest
    timing band (conservative); None where the table has nothing for the platform."""
    bands = (table().get("platforms") or {}).get(platform) or {}
    if not bands:
        return None
    name = catalogue.family(metric)
    entry = bands.get(name) if name is not None else None
    if entry is None:
        timing = {k: v for k, v in bands.items() if k in TIMING} or bands
        name, entry = max(timing.items(), key=lambda kv: float(kv[1]["boot_sd"]))
        source = f"{entry['source']}; {metric} has no family of its own: the widest {platform.upper()} band"
        return Band(platform, str(name), float(entry["boot_sd"]), source)
    return Band(platform, str(name), float(entry["boot_sd"]), str(entry["source"]))


#: Size classes of a served model by its estimated parameter count (``run.json``'s ``model_size``): a default band
#: was measured on models of some of them (``noise_bands.json``'s ``model_classes``), and a one-boot comparison is
#: judged with it only on a model of one of those. Upper bounds, exclusive.
SIZE_CLASSES: tuple[tuple[float, str], ...] = (
    (1e9, "under 1B parameters"),
    (1e10, "1B to 10B parameters"),
    (1e11, "10B to 100B parameters"),
    (float("inf"), "100B parameters or more"),
)


def size_class(parameters: int) -> str:
    """The size class of a model of ``parameters`` (estimated) parameters."""
    return next(name for bound, name in SIZE_CLASSES if parameters < bound)


def source_classes(platform: Platform) -> tuple[str, ...]:
    """The size classes of the models ``platform``'s default bands were measured on (empty: not recorded)."""
    found = (table().get("model_classes") or {}).get(platform) or ()
    return tuple(str(c) for c in found)


def unlike_source(platform: Platform, meta: Mapping[str, Any]) -> str | None:
    """Why the run in ``meta`` (``run.json``) is not the case ``platform``'s default bands were measured on, in
    words — its model's size class is not one of theirs, or its size is not known — or None: it is (or the run
    predates ``model_size`` and was judged as then)."""
    size = meta.get("model_size")
    classes = source_classes(platform)
    if not isinstance(size, Mapping) or not classes:
        return None
    parameters = size.get("parameters")
    if not isinstance(parameters, int) or isinstance(parameters, bool):
        return f"this run's model size is not known ({size.get('source') or 'no estimate'})"
    mine = size_class(parameters)
    if mine in classes:
        return None
    size = f"{parameters / 1e9:.2g}B parameters: {mine}"
    return f"this run's model ({size}) is unlike the band's models ({', '.join(classes)})"
