"""``kvcache-report`` (and ``pytest --kv-rerender``) interrupted: one line and exit 2, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kvcache import cli
from pytest_kvcache.model.options import ReportOptions


def test_ctrl_c_while_a_report_is_rebuilt_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "produce", interrupted)
    lines: list[str] = []
    code = cli.rerender(tmp_path, ReportOptions(noise=tmp_path), out=lines.append)
    assert code == 2
    assert lines == [
        f"interrupted: the report of {tmp_path} may be incomplete; build it again with: kvcache-report {tmp_path}"
    ]


def test_ctrl_c_in_history_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(argv: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "history_main", interrupted)
    assert cli.main(["history"]) == 2
    assert capsys.readouterr().err == "interrupted: kvcache-report history stopped\n"
