"""Progress lines: the engine's startup phase from its log, each request's figure, the ETA."""

from __future__ import annotations

from pathlib import Path

from pytest_kvcache.config.settings import Arm, Boot, Settings
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
