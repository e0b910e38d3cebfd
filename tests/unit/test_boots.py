from __future__ import annotations

from typing import Any

from pytest_kvcache.report.outputs import md_setup
from pytest_kvcache.report.sections.compile_cache import compile_cache_lines


def boot(position: int, arm: str, ready: float, cache: str | None, compile_s: float | None) -> dict[str, Any]:
    return {
        "position": position,
        "boot": f"{arm}.{position}",
        "arm": arm,
        "replicate": position,
        "extra": False,
        "status": "stopped",
        "skipped": None,
        "ready_s": ready,
        "started_unix_s": None,
        "compile_s": compile_s,
        "compile_cache": cache,
        "init_engine_s": None,
    }


def test_compile_cache_saving_per_arm() -> None:
    boots: list[Any] = [
        boot(1, "fp8", 226.0, "miss", 46.3),
        boot(2, "int8", 109.0, "miss", 31.5),
        boot(3, "int8", 70.0, "hit", 5.0),
        boot(4, "fp8", 66.0, "hit", 4.0),
        boot(5, "fp8", 62.0, "hit", 6.0),
    ]
    lines = compile_cache_lines(boots)
    assert lines == [
        "fp8: 1 boot(s) compiled (ready after 226 s), 2 loaded the compile cache (ready after 64 s mean): "
        "162 s saved a boot; torch.compile 46.3 s compiling, 5.0 s loading.",
        "int8: 1 boot(s) compiled (ready after 109 s), 1 loaded the compile cache (ready after 70 s mean): "
        "39 s saved a boot; torch.compile 31.5 s compiling, 5.0 s loading.",
    ]
    header, rows = md_setup.boot_table({"boots": boots, "boot_results": []})
    assert header[5] == "Compile" and [r[5] for r in rows[:3]] == ["compiled 46.3 s", "compiled 31.5 s", "cache 5.0 s"]


def test_no_compile_column_or_saving_without_compile_facts() -> None:
    eager: list[Any] = [boot(1, "auto", 50.0, None, None), boot(2, "auto", 48.0, None, None)]
    assert compile_cache_lines(eager) == []
    assert "Compile" not in md_setup.boot_table({"boots": eager, "boot_results": []})[0]
    one_kind: list[Any] = [boot(1, "a", 100.0, "miss", 40.0), boot(2, "b", 90.0, "hit", 3.0)]
    assert compile_cache_lines(one_kind) == []  # no arm has both kinds of boot: nothing to compare
