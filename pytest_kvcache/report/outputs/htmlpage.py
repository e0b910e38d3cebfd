"""``report.html``: the markdown report as one page, tables as tables, the PNG plots inlined."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping

from pytest_kvcache.model import Report


def render(report: Report, md: str, images: Mapping[str, bytes]) -> str:
    """The markdown report as one self-contained HTML page, with the plots inlined."""
    body = []
    in_table = False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set(line) <= {"|", "-"}:
                continue
            if not in_table:
                body.append("<table>")
                in_table = True
                body.append("<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cells) + "</tr>")
                continue
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            body.append(f"<p>• {html.escape(line[2:])}</p>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        body.append("</table>")
    for name, png in images.items():
        data = base64.b64encode(png).decode()
        body.append(
            f'<h2>{html.escape(name[:-4])}</h2><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
        )
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>pytest-kvcache {report.get('run_id')}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )
