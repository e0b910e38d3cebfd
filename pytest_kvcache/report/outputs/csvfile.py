"""``summary.csv``: one row per probe × point × metric × arm with n, mean, median, std, CV, min, max."""

from __future__ import annotations

import pandas as pd

from pytest_kvcache.model.report import Report


def render(report: Report) -> str:
    rows = [{k: v for k, v in s.items() if k != "excluded_reasons"} for s in report["summary"]]
    return str(pd.DataFrame(rows).to_csv(index=False))
