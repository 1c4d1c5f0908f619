"""A self-contained `report.html` that answers first: caveats, what the table says, the table, the
figures (inlined), and the methods last, collapsed."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence

import pandas as pd

from lightning_modules.convergence import CLASSES

# the headings, in table3.md too
SUMMARY, TABLE, FIGURES, METHODS = "What this table says", "The table", "Figures", "Methods"
TUNED = "Each row at its own best value"  # a tuned table's section (`reports.tuning`)

# Fits a 1,280-px window: cells wrap only where `_breakable` lets them, figures shrink to it.
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h2 { font-size: 1.15em; margin: 1.2em 0 0.4em; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 4px; text-align: right; }
th { background: #f2f2f2; font-weight: 600; }
td:first-child, th:first-child { text-align: left; font-weight: bold; }
th.text, td.text { text-align: left; min-width: 7em; }
.paper { display: block; color: #707070; font-weight: normal; }
td.converged { background: #dff0d8; } td.still-improving { background: #fcf3cf; }
td.overfitting { background: #fde0c5; } td.unstable, td.diverged { background: #f5c6cb; }
td.unknown { background: #e2e3e5; }
figure { display: inline-block; margin: 1em 1em 0 0; max-width: calc(100% - 1em); }
figure img { max-width: 100%; height: auto; }
#summary li { margin: 0.3em 0; max-width: 75em; }
.meta { color: #555; font-size: 13px; overflow-wrap: anywhere; }
.caveat { font-weight: bold; border-left: 4px solid #c0392b; padding: 2px 8px; max-width: 60em; }
details#methods { margin-top: 1.5em; }
details#methods > summary { cursor: pointer; font-weight: 600; font-size: 1.15em; }
"""


def lead(line: str) -> tuple[str, str]:
    """A summary line split into its head and what it says; ("", line) when it has no head."""
    head, sep, rest = line.partition(": ")
    return (head, rest) if sep else ("", line)


def _breakable(text: str) -> str:
    """Escaped `text` a browser may wrap only before a parenthesis or after a comma, never in a value."""
    out, depth = [], 0
    for i, ch in enumerate(text):
        depth += (ch in "[(") - (ch in "])")
        if ch == " ":
            free = depth == 0 and (text[i + 1:i + 2] == "(" or text[i - 1:i] == ",")
            out.append(" " if free else "&nbsp;")
        else:
            out.append(html.escape(ch))
    return "".join(out)


def _class_of(cell: str) -> str:
    """The CSS class of a convergence cell ("unstable (1/3)" -> "unstable"); empty when it has none."""
    label = cell.split(" (")[0]
    return label.replace(" ", "-") if label in CLASSES else ""


PAPER = " (paper)"  # a column whose name ends so holds ours, then the paper's value in parentheses


def _cell(value: object, column: str, class_column: str, text_column: str) -> str:
    """One `<td>`, classed by convergence or aligned left, the paper's value on a grey line of its own."""
    text = str(value)
    css = _class_of(text) if column == class_column else "text" if column == text_column else ""
    ours, sep, paper = text.rpartition(" (") if column.endswith(PAPER) and text.endswith(")") else ("", "", "")
    inner = (f'{_breakable(ours)} <span class="paper">({html.escape(paper)}</span>' if sep
             else _breakable(text))
    return f'<td class="{css}">{inner}</td>' if css else f"<td>{inner}</td>"


def _header(column: str, text_column: str) -> str:
    if column == text_column:
        return f'<th class="text">{html.escape(column)}</th>'
    if column.endswith(PAPER):
        return f'<th>{html.escape(column[:-len(PAPER)])} <span class="paper">{html.escape(PAPER[1:])}</span></th>'
    return f"<th>{html.escape(column)}</th>"


def _table(table: pd.DataFrame, class_column: str, text_column: str, name: str = "table3") -> str:
    """The table with each cell of `class_column` coloured by its convergence class."""
    head = "".join(_header(str(c), text_column) for c in table.columns)
    body = []
    for values in table.itertuples(index=False):
        cells = "".join(_cell(v, c, class_column, text_column) for c, v in zip(table.columns, values))
        body.append(f"<tr>{cells}</tr>")
    rows = "\n".join(body)
    return f'<table id="{name}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{rows}\n</tbody>\n</table>'


def _summary_item(line: str) -> str:
    head, rest = lead(line)
    return f"<li><b>{html.escape(head)}</b>: {html.escape(rest)}</li>" if head else f"<li>{html.escape(rest)}</li>"


def render(title: str, caption: str, table: pd.DataFrame, figures: dict[str, bytes],
           summary: Sequence[str] = (), methods: Sequence[str] = (), caveats: Sequence[str] = (),
           class_column: str = "converged", text_column: str = "changes from base",
           tuned: tuple[str, pd.DataFrame] | None = None) -> str:
    """The report page: caveats, summary, the table (and `tuned`'s), figures, methods (collapsed)."""
    warnings = "".join(f'<p class="caveat">{html.escape(c)}</p>\n' for c in caveats)
    said = ""
    if summary:
        items = "\n".join(_summary_item(line) for line in summary)
        said = f'<section id="summary">\n<h2>{SUMMARY}</h2>\n<ul>\n{items}\n</ul>\n</section>\n'
    images = "\n".join(
        f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"><figcaption>{html.escape(name)}</figcaption></figure>'
        for name, png in figures.items())
    shown = f'<section id="figures">\n<h2>{FIGURES}</h2>\n{images}\n</section>\n' if figures else ""
    notes = "\n".join(f"<li>{html.escape(n)}</li>" for n in methods)
    if tuned:
        shown = (f'<section id="tuning">\n<h2>{TUNED}</h2>\n<p class="meta">{html.escape(tuned[0])}</p>\n'
                 f'{_table(tuned[1], "", "row", "tuning-table")}\n</section>\n{shown}')
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{warnings}{said}"
            f"<h2>{TABLE}</h2>\n<p class=\"meta\" id=\"caption\">{html.escape(caption)}</p>\n"
            f"{_table(table, class_column, text_column)}\n{shown}"
            f"<details id=\"methods\">\n<summary>{METHODS}</summary>\n<ul class=\"meta\">\n{notes}\n</ul>\n"
            f"</details>\n</body>\n</html>\n")
