"""Energy per token and what the verdict cost, through pytest on the stand-in engine.

No GPU runs here, so the GPU is the public fake NVML (``pytest_kvcache.testing.fake_nvml``), put in place of
NVML by the test project's conftest: one card drawing a known 300 W whose total-energy counter moves in steps,
as an H200's does (10 ms steps here, where the H200's are ~100 ms, so the stand-in's sub-second decode windows
are long enough to be reported; the rule and the 100 ms case are unit-tested in tests/unit/gpu/test_energy.py).
"""

from __future__ import annotations

import json

import pytest

from tests.plugin.conftest import latest

WATTS = 300.0

FAKE_GPU = f"""
import pytest_kvcache.gpu.state as gpu_state
from pytest_kvcache.testing.fake_nvml import FakeCard, FakeNvml


def pytest_configure(config):
    card = FakeCard(uuid="GPU-e37e0000-0000-0000-0000-000000000000", power_usage_mw={int(WATTS * 1000)},
                    energy_step_s=0.01)
    fake = FakeNvml([card])
    original = gpu_state.open_nvml
    gpu_state.open_nvml = lambda: fake
    config.add_cleanup(lambda: setattr(gpu_state, "open_nvml", original))
"""


@pytest.fixture
def args(standin_args: list[str], tag: str) -> list[str]:
    """Two arms, short probes, 3 requests of 120 tokens at 3 ms a token: ~0.36 s decode windows."""
    kept = [
        a
        for a in standin_args
        if not a.startswith(("--kv-warmups", "--kv-runs", "--kv-max-tokens", "--kv-engine-args"))
    ]
    return [
        *kept,
        f"--kv-engine-args={tag} --standin-itl=0.003",
        "--kv-warmups=0",
        "--kv-runs=3",
        "--kv-max-tokens=120",
        "--kv-arms=auto,float16",
    ]


def test_energy_rows_gates_and_the_cost_line_on_a_fake_gpu(pytester: pytest.Pytester, args: list[str]) -> None:
    pytester.makeconftest(FAKE_GPU)
    gates = ["--kv-fail=energy_per_token[short]: <= 100", "--kv-fail=energy_per_token[short]: float16 <= auto * 5"]
    result = pytester.runpytest_subprocess(*args, *gates)
    assert result.ret == 0, result.stdout.str()
    run = latest(pytester)
    meter = [json.loads(line) for line in (run / "energy.jsonl").read_text().splitlines()]
    assert meter[0]["kind"] == "meter" and meter[0]["hz"] == 50.0 and len(meter) > 20
    report = json.loads((run / "report.json").read_text())

    # energy rows: per arm, probe, point and window, at the card's known power
    section = report["energy"]
    assert section["how"]["cards"][0]["source"] == "counter"
    rows = {(r["arm"], r["point"]): r for r in section["rows"] if r["metric"] == "energy_per_token"}
    assert set(rows) == {(arm, shape) for arm in ("auto", "float16") for shape in ("code", "narrative")}
    speed = {
        (s["arm"], s["point"]): s["mean"]
        for s in report["summary"]
        if s["probe"] == "short" and s["metric"] == "decode_tps"
    }
    for key, row in rows.items():
        assert row["window"] == "decode" and row["boots_reported"] == 1 and row["windows"] == 3
        assert row["mean_power_w"] == pytest.approx(WATTS, rel=0.08), key
        assert row["joules_per_token"] == pytest.approx(WATTS / speed[key], rel=0.1), key  # J/token = W / (tok/s)
    assert {r["metric"] for r in section["rows"]} == {"energy_per_token"}  # short: decode only
    assert section["not_reported"] == []
    deltas = [d for d in report["deltas"] if d["metric"] == "energy_per_token"]
    assert {d["point"] for d in deltas} == {"code", "narrative"} and all(d["ci_low"] is not None for d in deltas)

    # gateable like any metric: absolute per arm, and between arms (one boot a side: the within-boot CI widened
    # by the default GPU band of energy's family, the decode rate's, decides a gate met by far)
    absolute = [g for g in report["gates"] if g["gate"] == "energy_per_token[short]: <= 100"]
    assert len(absolute) == 4 and all(g["outcome"] == "pass" for g in absolute)
    between = [g for g in report["gates"] if "float16 <= auto * 5" in g["gate"]]
    assert len(between) == 2 and all(g["outcome"] == "pass" for g in between)
    assert all("GPU decode rate band" in str(g["evidence"]) for g in between), between

    # the cost: one card, split, on every first screen
    cost = report["cost"]
    assert cost["unit"] == "GPU-s" and cost["cards"] == 1 and cost["boots"] == 2
    assert cost["booting"] > 0 and cost["measuring"] > 0
    assert cost["total"] == pytest.approx(cost["booting"] + cost["measuring"] + cost["waiting"])
    assert list(report).index("cost") < list(report).index("arms")  # near the top of report.json
    md = (run / "report.md").read_text()
    head = md.split("## Arms")[0]
    assert "Cost: " in head and "GPU-s (1 card × " in head and "booting " in head and "waiting " in head
    assert "## Energy per token" in md and "NVML's total-energy counter on 1 card(s)" in md
    assert "| Narrative energy_per_token |" in md
    html = (run / "report.html").read_text()
    verdict = html.split('<section id="verdict"')[1].split("</section>")[0]
    assert "Cost: " in verdict and "Energy per token" in html
    result.stdout.fnmatch_lines(
        [
            "energy auto short@code decode: * mJ/token (* J over 3 windows, * s, * W)",
            "gate PASS: energy_per_token[[]short@code]: <= 100 (auto)*",
            "Cost: * GPU-s (1 card × *): booting * GPU-s (*%, 2 boots*), measuring * GPU-s (*%), waiting *",
            "report: *report.md*",
        ]
    )


def test_without_a_gpu_the_cost_is_wall_time_and_there_is_no_energy(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == 0, result.stdout.str()
    run = latest(pytester)
    report = json.loads((run / "report.json").read_text())
    assert report["energy"]["rows"] == [] and report["energy"]["line"] is None
    assert not (run / "energy.jsonl").exists()
    assert "energy_per_token" not in {d["metric"] for d in report["deltas"]}
    assert report["cost"]["unit"] == "s" and report["cost"]["cards"] == 0
    result.stdout.fnmatch_lines(["Cost: * of wall time (no GPU recorded): booting *, measuring *, waiting *"])
    assert "## Energy per token" not in (run / "report.md").read_text()


def test_a_gate_on_an_energy_metric_a_probe_lacks_is_a_usage_error(pytester: pytest.Pytester, args: list[str]) -> None:
    result = pytester.runpytest_subprocess(*args, "--kv-fail=energy_per_joule[short]: <= 1")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown metric 'energy_per_joule'*energy_per_token*"])
