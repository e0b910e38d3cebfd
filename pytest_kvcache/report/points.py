"""Where a record sits on its probe's axis (a shape, a depth like ``10k``, ``turnN``, a concurrency level), the
order the points go in, and how many boots per arm a CI over boots needs: what every part of the report reads
before it compares anything. Plain Python, no pandas."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_kvcache import stats
from pytest_kvcache.metrics import catalogue
from pytest_kvcache.model.records import Record
from pytest_kvcache.model.report import Comparison
from pytest_kvcache.probes.registry import ProbeSpec, user_spec

#: With this many boots per arm or more, CIs are computed over boots (hierarchical bootstrap).
MIN_BOOTS_FOR_BOOT_CI = 3

Specs = Mapping[str, ProbeSpec]


def spec_of(probe: str | None, specs: Specs) -> ProbeSpec:
    """The registered spec of ``probe``, or a user probe's default spec."""
    name = str(probe)
    return specs.get(name) or user_spec(name)


def point_of(record: Record, specs: Specs) -> str:
    """The position a record occupies on its probe's axis: shape, depth label (``10k``) or ``turnN``."""
    spec = spec_of(record.get("probe"), specs)
    if spec.point == "turn" and record.get("turn") is not None:
        return f"turn{record.get('turn')}"
    depth = record.get("depth")
    if spec.point == "depth" and depth is not None:
        depth = int(depth)
        return f"{depth // 1000}k" if depth % 1000 == 0 else str(depth)
    return str(record.get("shape") or "-")


def point_sort(point: str) -> tuple[int, float, str]:
    """Axis order: depths by size (``4k`` < ``10k``), turns and concurrency levels by number, then shapes."""
    if point.startswith("turn") and point[4:].isdigit():
        return (1, float(point[4:]), point)
    if point.startswith("c") and point[1:].isdigit():  # concurrency level
        return (1, float(point[1:]), point)
    digits = point[:-1] if point.endswith("k") else point
    try:
        return (0, float(digits) * (1000 if point.endswith("k") else 1), point)
    except ValueError:
        return (2, 0.0, point)


def provisional_note(boots: int) -> str:
    """Why a better/worse verdict (or a gate) from a within-boot CI is provisional."""
    return f"{boots} boot{'' if boots == 1 else 's'} per arm: within-boot CI only"


def comparison(
    metric: str,
    values: tuple[float | None, float | None],
    interval: tuple[float | None, float | None, float | None],
    *,
    paired: bool,
    method: str,
    n: tuple[int, int],
    boots: tuple[int, int],
) -> Comparison:
    """The fields every comparison of an arm with the baseline has, in report.json's order: the baseline's and the
    arm's ``values``, the ratio and its CI (``interval``: ratio, low, high), how the CI was made (``paired``,
    ``method``), on how many samples and boots a side, the metric's direction and the verdict the CI gives."""
    ratio, lo, hi = interval
    return {
        "baseline_value": values[0],
        "arm_value": values[1],
        "ratio": ratio,
        "delta_pct": (ratio - 1) * 100 if ratio is not None else None,
        "ci_low": lo,
        "ci_high": hi,
        "paired": paired,
        "ci_method": method,
        "n_baseline": n[0],
        "n_arm": n[1],
        "boots_baseline": boots[0],
        "boots_arm": boots[1],
        "direction": catalogue.direction(metric),
        "verdict": stats.verdict(metric, lo, hi),
    }
