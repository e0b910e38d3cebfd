"""What the energy meter costs the measuring client: the self-check against a calibrated stream with the run's GPU
threads off, and on (the 4 Hz sampler alone, then with the energy meter at 50 Hz and at 200 Hz).

The self-check (``pytest_kvcache.selfcheck``) streams from a calibrated server in a child process (no GIL
shared with the client) and compares what our client measured with what the server sent: TTFT error,
decode-TPS error and the client's CPU per chunk. The GPU threads run in the client's process, as in a run;
whatever they take from it (the GIL, a core) shows in those errors. Configurations alternate (A B C D D C B A
…) so a busy machine's drift loads them alike. Also: the meter's own cost per read, on this thread.

    python benchmarks/energy_meter.py [--rounds 4] [--nvml fake|real]

``--nvml fake`` (the default, any machine): the fake NVML, whose reads are plain Python and hold the GIL
throughout — more than the real ``pynvml``, whose ``ctypes`` calls release it while the driver works.
``--nvml real``: the machine's NVML (a GPU host; read-only calls).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from pytest_kvcache.gpu.cards import visible_cards
from pytest_kvcache.gpu.energy import EnergyMeter
from pytest_kvcache.gpu.nvml import Nvml, last_open_error, open_nvml
from pytest_kvcache.gpu.sampler import Sampler
from pytest_kvcache.selfcheck import run_self_check
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml

CONFIGS: dict[str, tuple[bool, float | None]] = {
    "no GPU threads": (False, None),
    "sampler 4 Hz": (True, None),
    "sampler 4 Hz + meter 50 Hz": (True, 50.0),
    "sampler 4 Hz + meter 200 Hz": (True, 200.0),
}


def make_nvml(kind: str) -> Nvml:
    if kind == "real":
        nvml = open_nvml()
        if nvml is None:
            sys.exit(f"no NVML here: {last_open_error()}")
        return nvml
    return FakeNvml([FakeCard(uuid="GPU-bench000-0000-0000-0000-000000000000", power_usage_mw=450_000)])


@contextlib.contextmanager
def threads(nvml: Nvml, sampler: bool, meter_hz: float | None) -> Iterator[None]:
    cards = visible_cards(nvml, {})
    running: list[Any] = []
    try:
        if sampler:
            running.append(Sampler(nvml, cards, hz=4.0).start())
        if meter_hz is not None:
            running.append(EnergyMeter(nvml, cards, hz=meter_hz).start())
        yield
    finally:
        for thread in running:
            thread.stop()


def read_cost_us(nvml: Nvml, reads: int = 2000) -> tuple[float, float]:
    """CPU and wall µs per ``read_once`` of the meter over every card, on this thread."""
    meter = EnergyMeter(nvml, visible_cards(nvml, {}))
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(reads):
        meter.read_once()
    return (time.thread_time() - cpu) / reads * 1e6, (time.perf_counter() - wall) / reads * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="full self-checks per configuration (20 streams each)")
    parser.add_argument("--nvml", choices=("fake", "real"), default="fake")
    args = parser.parse_args(argv)
    nvml = make_nvml(args.nvml)
    names = list(CONFIGS)
    order = [n for r in range(args.rounds) for n in (names if r % 2 == 0 else names[::-1])]
    found: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for name in order:
        sampler, hz = CONFIGS[name]
        with threads(nvml, sampler, hz):
            check = run_self_check(quick=False, server="process")
        for metric in ("ttft_error_ms", "decode_tps_error_pct", "cpu_per_chunk_us"):
            for key in ("median", "p95"):
                value = check["metrics"][metric][key]
                if value is not None:
                    found[name].setdefault(f"{metric} {key}", []).append(float(value))
    cpu_us, wall_us = read_cost_us(nvml)
    cards = len(visible_cards(nvml, {}))
    print(f"NVML: {args.nvml}, {cards} card(s); {args.rounds} full self-checks (20 streams of 500 tokens at 1 ms) each")
    print(f"meter read (every card once): {cpu_us:.1f} µs CPU, {wall_us:.1f} µs wall on this thread")
    header = ["configuration", "TTFT err median ms", "p95 ms", "decode err median %", "p95 %", "CPU/chunk median µs"]
    print(" | ".join(header))
    for name in names:
        f = found[name]

        def med(key: str, f: dict[str, list[float]] = f) -> str:
            return f"{statistics.median(f[key]):.4f}" if f.get(key) else "–"

        print(
            " | ".join(
                [
                    name,
                    med("ttft_error_ms median"),
                    med("ttft_error_ms p95"),
                    med("decode_tps_error_pct median"),
                    med("decode_tps_error_pct p95"),
                    med("cpu_per_chunk_us median"),
                ]
            )
        )
    nvml.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
