"""A self-contained `report.html`: the table, the rank correlations and the figures inlined."""

from __future__ import annotations

import base64
import html

import pandas as pd

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; white-space: normal; max-width: 9em; }
td:first-child, th:first-child { text-align: left; font-weight: bold; }
figure { display: inline-block; margin: 1em 1em 0 0; }
.meta { color: #555; font-size: 13px; }
"""


def render(title: str, caption: str, table: pd.DataFrame, notes: list[str], figures: dict[str, bytes]) -> str:
    """The report page; `table` holds display strings, `figures` PNG bytes by file name."""
    rows_html = table.to_html(index=False, escape=True, border=0, table_id="table3")
    images = "\n".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"><figcaption>{html.escape(name)}</figcaption></figure>'
        for name, png in figures.items())
    items = "\n".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n<p class=\"meta\">{html.escape(caption)}</p>\n"
            f"{rows_html}\n<ul class=\"meta\">\n{items}\n</ul>\n{images}\n</body>\n</html>\n")
