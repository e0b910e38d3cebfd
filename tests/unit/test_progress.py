"""Progress lines: the engine's startup phase from its log, each request's figure, the ETA."""

from __future__ import annotations

from pathlib import Path

from pytest_kvcache.config.arms import Arm
from pytest_kvcache.config.plan import Boot
from pytest_kvcache.config.settings import Settings
from pytest_kvcache.run.progress import Progress, engine_phase, figure

LOG = (
    Path(__file__).resolve().parents[2]
    / "docs"
    / "results"
    / "h200-fp8-vs-int8"
    / "run"
    / "arms"
    / "fp8"
    / "engine.log"
)


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str) -> None:
        self.lines.append(text)

    def rewrite(self, text: str) -> None:
        self.lines.append("\r" + text)


def test_the_phase_is_the_last_startup_line_of_a_real_vllm_log(tmp_path: Path) -> None:
    partial = tmp_path / "engine.log"
    lines = LOG.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "Compiling a graph" in line)
    partial.write_text("\n".join(lines[: cut + 1]) + "\n")
    assert engine_phase(partial) == "Compiling a graph for compile range (1, 8192) takes 24.40 s"
    assert engine_phase(tmp_path / "absent.log") is None


def test_figures_and_the_eta() -> None:
    record = {"probe": "prefill", "ok": True, "phase": "measured", "metrics": {"ttft_s": 11.0, "prefill_tps": 2908.4}}
    assert figure(record) == "ttft 11.00 s 2,908 prefill tok/s"  # type: ignore[arg-type]
    now = [0.0]
    out = Lines()
    progress = Progress(out, Settings(arms=()), mode="lines", clock=lambda: now[0])
    progress.planned({"a": 3, "b": 3})
    assert progress.eta() is None
    a = Boot(arm=Arm(name="a", kv_cache_dtype=None), index=0)
    progress.boot_starting(a, Path("/nonexistent.log"))
    now[0] = 60.0
    progress.boot_ready(a, {"ready_s": 60.0})
    assert out.lines[-1] == "kvcache: a ready after 60.0 s"  # no test timed yet: no ETA from a boot alone
    now[0] = 90.0
    progress.test_done("test_short[a-code]")  # 1 boot left at 60 s + 5 tests at 30 s
    assert out.lines[-1] == "kvcache: 1/6 probe tests done (test_short[a-code]); run ETA 4 min"
    progress.recorded(
        {
            "probe": "short",
            "shape": "code",
            "boot": "a",
            "phase": "measured",
            "index": 1,
            "ok": True,
            "metrics": {"ttft_s": 0.08, "decode_tps": 93.2},
        },
        5,
    )  # type: ignore[arg-type]
    assert out.lines[-1] == "kvcache: short@code a 2/5 ttft 80 ms 93 decode tok/s"


def test_two_lanes_boot_side_by_side_and_the_eta_counts_them_once() -> None:
    """pytest-xdist lanes: two boots start together and each ends on its own line with its own time; the
    boot time counts once per boot and the work left is shared by the lanes."""
    now = [0.0]
    out = Lines()
    progress = Progress(out, Settings(arms=(), lanes=2), mode="lines", clock=lambda: now[0])
    progress.planned({"a.r1": 3, "b.r1": 3, "b.r2": 3, "a.r2": 3})
    a, b = (Boot(arm=Arm(name=n, kv_cache_dtype=None), index=i, replicate=1, replicates=2) for i, n in enumerate("ab"))
    progress.boot_starting(a, Path("/nonexistent.log"))
    progress.boot_starting(b, Path("/nonexistent.log"))
    now[0] = 40.0
    progress.boot_ready(b, {"ready_s": 40.0})
    now[0] = 60.0
    progress.boot_ready(a, {"ready_s": 60.0})
    assert out.lines[-2:] == ["kvcache: b.r1 ready after 40.0 s", "kvcache: a.r1 ready after 60.0 s"]
    assert progress.boot_s == 100.0 and not progress._booting
    now[0] = 90.0
    progress.test_done("test_short[a.r1-code]")
    # 2 boots left at 50 s + 11 tests at (90 s × 2 lanes − 100 s of boots) / 1 test, shared by 2 lanes
    assert (
        out.lines[-1]
        == f"kvcache: 1/12 probe tests done (test_short[a.r1-code]); run ETA {(2 * 50 + 11 * 80) / 2 / 60:.0f} min"
    )
