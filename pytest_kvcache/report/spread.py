"""Which boot-to-boot spread a comparison with fewer than 3 boots per arm is judged with — the one rule for
deltas (``report.bands.judge_deltas``), ratio and absolute gates (``report.gates``) and the A/A noise run
(``--kv-noise``, ``report.judge``).

A within-boot CI cannot see the next boot, so a verdict or a gate on it is judged on that CI widened by a
boot-to-boot spread σ (the SD of log(one boot's mean)): ``ratio · exp(± q · sqrt(se_w² + σ² (1/n_b + 1/n_a)))``
(``stats.widen``). No directional claim unless that spread would hold on the host the run measured on:

1. ``--kv-noise``: the stored A/A's σ̂ of log boot means (from the same host), scaled by this run's boots, with
   Student's t on the A/A's degrees of freedom.
2. From 2 boots on a side: the larger of the default band and the pooled SD of this run's log boot means, with
   Student's t on the pooled degrees of freedom (the run's own spread can only widen the interval).
3. One boot per arm: the default band of the metric's family on this platform — when no sample of the run
   saw the host busy (``host_cpu_busy``) and the served model is of a size class the band was measured on
   (``bands.unlike_source``), the case the band was measured on; otherwise the widest spread measured on any
   host (``noise_bands.json`` ``widest``: a loaded 2-core A/A), so only a miss beyond anything an A/A ever
   showed is claimed.
4. No band for the platform and no run spread: no claim (the interval is unbounded, the outcome inconclusive).

Plain Python: no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pytest_kvcache import stats
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.report import SpreadInfo
from pytest_kvcache.report import bands

Kind = Literal["noise run", "run's boots", "default band", "widest", "no band"]


@dataclass(frozen=True)
class Spread:
    """A boot-to-boot spread to widen a within-boot interval with: σ of log(boot mean), the t quantile's degrees
    of freedom (inf: a fixed band, the normal quantile), what kind it is and its source in words."""

    kind: Kind
    sd: float
    df: float
    text: str

    @property
    def short(self) -> str:
        """Its words without the figures in parentheses: "the default CPU decode rate band"."""
        return self.text.split(" (", 1)[0]

    def info(self) -> SpreadInfo:
        return {
            "kind": self.kind,
            "sd_pct": None if not math.isfinite(self.sd) else round(self.sd * 100, 3),
            "df": None if not math.isfinite(self.df) else self.df,
            "text": self.text,
        }


NO_SPREAD = Spread("no band", math.inf, math.inf, "no boot-to-boot spread for this platform and too few boots")


def widest(metric: str) -> Spread | None:
    """The widest boot-to-boot spread of ``metric``'s family measured on any host (``noise_bands.json``)."""
    found = bands.table().get("widest") or {}
    name = catalogue.family(metric)
    entry = found.get(name) if name is not None else None
    if entry is None and found:
        timing = {k: v for k, v in found.items() if k in bands.TIMING} or found
        entry = max(timing.values(), key=lambda e: float(e["boot_sd"]))
    if entry is None:
        return None
    sd = float(entry["boot_sd"])
    return Spread("widest", sd, math.inf, f"the widest spread measured on any host (SD {sd * 100:.0f}%, {entry['at']})")


def choose(
    metric: str,
    platform: bands.Platform,
    boots: tuple[int, int],
    *,
    run: tuple[float, int] | None = None,
    host_busy: int = 0,
    noise: Spread | None = None,
    unlike: str | None = None,
) -> Spread:
    """The spread a within-boot comparison of ``metric`` is judged with (the module's rules 1–4): ``boots``
    per side, ``run`` this run's pooled SD of log boot means and its df, ``host_busy`` the compared samples
    that saw the host busy, ``noise`` the stored A/A's spread, ``unlike`` why the run's model is not the kind
    the default band was measured on (``bands.unlike_source``; None: it is)."""
    if noise is not None:
        return noise
    band = bands.band(metric, platform)
    if run is not None and max(boots) >= 2:
        sd, df = run
        if band is not None and band.boot_sd >= sd:
            text = f"{band.describe()}, wider than this run's boots (SD {sd * 100:.1f}%); t on {df} df"
            return Spread("default band", band.boot_sd, float(df), text)
        return Spread("run's boots", sd, float(df), f"this run's boot-to-boot spread (SD {sd * 100:.1f}%, {df} df)")
    if band is not None and not host_busy and unlike is None:
        return Spread("default band", band.boot_sd, math.inf, band.describe())
    if band is not None or host_busy:
        wide = widest(metric)
        if wide is not None:
            why = f"{host_busy} compared sample(s) saw the host busy" if host_busy else unlike or "no band"
            return Spread(wide.kind, wide.sd, wide.df, f"{wide.text}: {why}")
    return NO_SPREAD


def ratio_interval(ratio: float, lo: float, hi: float, spread: Spread, boots: tuple[int, int]) -> tuple[float, float]:
    """The within-boot ratio CI ``[lo, hi]`` widened by ``spread`` at ``boots`` per side."""
    if not math.isfinite(spread.sd):
        return 0.0, math.inf
    return stats.widen(ratio, lo, hi, spread.sd, boots, df=spread.df)


def mean_interval(mean: float, lo: float, hi: float, spread: Spread, boots: int) -> tuple[float, float]:
    """One arm's within-boot CI of a mean widened by ``spread`` at ``boots``."""
    if not math.isfinite(spread.sd):
        return -math.inf, math.inf
    return stats.widen(mean, lo, hi, spread.sd, (boots,), df=spread.df)


def for_comparison(
    metric: str,
    cmp: Mapping[str, Any],
    platform: bands.Platform,
    noise: Spread | None = None,
    run_busy: int | None = None,
    unlike: str | None = None,
) -> tuple[Spread, tuple[int, int]]:
    """:func:`choose` for a ``report.frame.compare`` result (a delta row or a gate's comparison). ``run_busy``:
    the samples of the whole run that saw the host busy — a host busy at any point of a run is a loaded host,
    and a one-boot comparison elsewhere in it is no more the case the band was measured on (the comparison's
    own count where not given); ``unlike``: as :func:`choose` takes it."""
    boots = (max(int(cmp.get("boots_baseline") or 1), 1), max(int(cmp.get("boots_arm") or 1), 1))
    sd, df = cmp.get("boot_sd"), cmp.get("boot_df")
    run = (float(sd), int(df)) if sd is not None and df is not None else None
    busy = int(cmp.get("host_busy") or 0) if run_busy is None else run_busy
    return choose(metric, platform, boots, run=run, host_busy=busy, noise=noise, unlike=unlike), boots


def from_aa(sd: float, df: int, name: str) -> Spread:
    """A stored A/A's spread of one (probe, point, metric): σ̂ of its log boot means over ``df`` degrees of
    freedom (``report.judge.noise_bands``)."""
    return Spread("noise run", sd, float(df), f"the A/A noise run {name} (SD {sd * 100:.1f}%, {df} df; --kv-noise)")


#: Noise spreads of a stored A/A per (probe, point, metric) (``report.judge.noise_bands``).
NoiseSpreads = Mapping[tuple[str, str, str], Spread]


def judge_deltas(
    deltas: list[Any],
    platform: bands.Platform,
    noise: NoiseSpreads | None = None,
    run_busy: int | None = None,
    unlike: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Judge every within-boot delta's verdict on its CI widened by its spread (in place), as a gate on it is
    judged: better or worse only beyond boot-to-boot variation. A delta over boots keeps its verdict (its CI
    covers boots). Stores ``judged_ci``, ``band_pct`` (the spread's SD), ``spread`` and, when a directional
    verdict turned inconclusive, ``verdict_note``. Returns what was used: ``families`` (default band family →
    its SD percent) and ``spreads`` (kind → its words, the first of each kind: the report's first screen)."""
    families: dict[str, float] = {}
    used: dict[str, str] = {}
    for d in deltas:
        for key in ("judged_ci", "band_pct", "spread", "verdict_note", "provisional"):
            d.pop(key, None)
        lo, hi, ratio = d.get("ci_low"), d.get("ci_high"), d.get("ratio")
        if d.get("ci_method") != "within-boot" or lo is None or hi is None or ratio is None or ratio <= 0:
            continue
        mine = (noise or {}).get((str(d["probe"]), str(d["point"]), str(d["metric"])))
        found, boots = for_comparison(str(d["metric"]), d, platform, mine, run_busy, unlike)
        wide_lo, wide_hi = ratio_interval(float(ratio), float(lo), float(hi), found, boots)
        was = stats.verdict(str(d["metric"]), lo, hi)
        judged = stats.verdict(str(d["metric"]), wide_lo, wide_hi)
        d["spread"] = found.info()
        family = catalogue.family(str(d["metric"])) if found.kind == "default band" else None
        used.setdefault(f"{found.kind}: {family}" if family else found.kind, found.text)  # each family's band named
        if found.kind == "default band" and (name := catalogue.family(str(d["metric"]))) is not None:
            families[name] = found.sd * 100
        if math.isfinite(found.sd):
            d["band_pct"] = found.sd * 100
            d["judged_ci"] = [wide_lo, wide_hi]
        if was != "inconclusive" and judged == "inconclusive":
            d["verdict_note"] = f"within {found.text}"
        d["verdict"] = judged
        if judged != "inconclusive":
            n = min(boots)
            d["provisional"] = f"{n} boot{'' if n == 1 else 's'} per arm: within-boot CI widened by {found.short}"
    return {"families": families, "spreads": used}
