"""Per arm and probe: the NVML samples (run/gpu.jsonl) that fall inside measured requests
(run/requests.jsonl) — max power, max temperature, lowest and median SM clock.

    python scripts/h200/gpu_windows.py docs/results/h200-replicated/run
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(run: Path) -> None:
    samples = [json.loads(line) for line in (run / "gpu.jsonl").read_text().splitlines() if line]
    found: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for line in (run / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("phase") != "measured":
            continue
        start = record["sample"]["send_unix_s"]
        end = start + record["sample"]["end_s"]
        found[(record["arm"], record["probe"])] += [s for s in samples if start <= s["t_unix_s"] <= end]
    print("| Arm | Probe | NVML samples | Max power | Max temp | Lowest SM clock | Median SM clock |")
    print("|---|---|---|---|---|---|---|")
    for (arm, probe), got in sorted(found.items()):
        clocks = sorted(s["sm_clock_mhz"] for s in got)
        print(
            f"| {arm} | {probe} | {len(got)} | {max(s['power_w'] for s in got):.0f} W | "
            f"{max(s['temp_c'] for s in got)} °C | {clocks[0]} MHz | {clocks[len(clocks) // 2]} MHz |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
