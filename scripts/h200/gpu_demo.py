"""NVML snapshot + sampled load trace, written with the plugin's own ``pytest_kvcache.gpu`` modules (read-only NVML)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from pytest_kvcache.gpu.cards import visible_cards
from pytest_kvcache.gpu.nvml import last_open_error, open_nvml
from pytest_kvcache.gpu.sampler import Sampler
from pytest_kvcache.gpu.snapshot import diff, snapshot

out = Path(sys.argv[1])
nvml = open_nvml()
if nvml is None:
    sys.exit(f"no NVML: {last_open_error()}")
cards = visible_cards(nvml)
before = snapshot(nvml, cards)
trace = out.with_name("gpu-demo-trace.jsonl")
with Sampler(nvml, cards, trace, hz=4.0) as sampler:
    time.sleep(3.0)
    idle_end = time.time()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    load_start = time.time()
    while time.time() - load_start < 30:
        for _ in range(50):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()
    load_end = time.time()
    time.sleep(3.0)
    windows = {
        "idle": sampler.window(load_start - 3.0, idle_end),
        "load": sampler.window(load_start, load_end),
        "after": sampler.window(load_end, time.time()),
    }
after = snapshot(nvml, cards)
out.write_text(
    json.dumps(
        {"before": before, "after": after, "windows": windows, "diff": diff(before, after), "trace": trace.name},
        indent=1,
    )
)
nvml.shutdown()
print(
    json.dumps(
        {
            k: {
                kk: v.get(kk)
                for kk in (
                    "samples",
                    "mean_power_w",
                    "max_power_w",
                    "max_temp_c",
                    "min_sm_clock_mhz",
                    "throttle_reasons_seen",
                )
            }
            for k, v in windows.items()
        }
    )
)
