"""A self-contained `report.html`: the table, the rank correlations and the figures inlined."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

import pandas as pd

from lightning_modules.convergence import CLASSES

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; white-space: normal; max-width: 9em; }
td:first-child, th:first-child { text-align: left; font-weight: bold; }
figure { display: inline-block; margin: 1em 1em 0 0; }
td.converged { background: #dff0d8; } td.still-improving { background: #fcf3cf; }
td.overfitting { background: #fde0c5; } td.unstable, td.diverged { background: #f5c6cb; }
td.unknown { background: #e2e3e5; }
td.wrap { white-space: normal; min-width: 8em; max-width: 12em; text-align: left; }
.meta { color: #555; font-size: 13px; }
.caveat { font-weight: bold; border-left: 4px solid #c0392b; padding: 2px 8px; max-width: 60em; }
"""


def _class_of(cell: str) -> str:
    """The CSS class of a convergence cell ("unstable (1/3)" -> "unstable"); empty when it has none."""
    label = cell.split(" (")[0]
    return label.replace(" ", "-") if label in CLASSES else ""


def _cell(value: object, column: str, class_column: str, wrap_column: str) -> str:
    """One `<td>`: a `class_column` cell classed by its convergence class; a `wrap_column` cell
    breaking between a row's changes ("d_model 1024, d_k 128"), never inside one."""
    text = html.escape(str(value))
    if column == wrap_column:
        return '<td class="wrap">' + ", ".join(item.replace(" ", "&nbsp;") for item in text.split(", ")) + "</td>"
    css = _class_of(str(value)) if column == class_column else ""
    return f'<td class="{css}">{text}</td>' if css else f"<td>{text}</td>"


def _table(table: pd.DataFrame, class_column: str, wrap_column: str) -> str:
    """The table with each cell of `class_column` coloured by its convergence class, and the cells of
    `wrap_column` (the long lists of a row's changes) wrapped, so the table fits a normal window."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
    body = []
    for values in table.itertuples(index=False):
        cells = "".join(_cell(v, c, class_column, wrap_column) for c, v in zip(table.columns, values))
        body.append(f"<tr>{cells}</tr>")
    rows = "\n".join(body)
    return f'<table id="table3">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>'


def render(title: str, caption: str, table: pd.DataFrame, notes: list[str], figures: dict[str, bytes],
           class_column: str = "converged", wrap_column: str = "changes from base",
           caveats: Sequence[str] = ()) -> str:
    """The report page; `table` holds display strings (its `class_column` cells coloured by
    convergence class, its `wrap_column` cells wrapped), `figures` PNG bytes by file name,
    `caveats` what to read before the table (shown above it)."""
    rows_html = _table(table, class_column, wrap_column)
    images = "\n".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"><figcaption>{html.escape(name)}</figcaption></figure>'
        for name, png in figures.items())
    items = "\n".join(f"<li>{html.escape(n)}</li>" for n in notes)
    warnings = "".join(f'<p class="caveat">{html.escape(c)}</p>\n' for c in caveats)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n<p class=\"meta\">{html.escape(caption)}</p>\n"
            f"{warnings}{rows_html}\n<ul class=\"meta\">\n{items}\n</ul>\n{images}\n</body>\n</html>\n")
