"""What the results pages and the front page say about a committed table is what its table says:
each page's generated block is the one its report gives today, its headline is the report's first
sentence, no result number or count is written by hand outside the block, and the front page's
results row carries the counts of the table it links to."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from reports.pages import BEGIN, END, block, read_frame, readme_summary, replace_block, report_headline
from reports.seeds import PAPER_THRESHOLD
from reports.verdicts import headline

REPO = Path(__file__).resolve().parent.parent
COMMITTED = ["cpu-converged-2026-11-22", "cpu-modifications-2026-11-26"]


def folder(name: str) -> Path:
    return REPO / "reports" / "results" / name


@pytest.mark.parametrize("name", COMMITTED)
def test_a_results_pages_generated_block_is_its_report(name: str):
    page = (folder(name) / "README.md").read_text(encoding="utf-8")
    assert page.count(BEGIN) == 1 and page.count(END) == 1
    assert replace_block(page, block(folder(name))) == page, "run `python -m reports.pages` on the folder"
    # the headline counted from the CSV is the report's own first sentence
    assert headline(read_frame(folder(name))) == report_headline(folder(name))
    assert f"**{report_headline(folder(name))}**" in page


@pytest.mark.parametrize("name", COMMITTED)
def test_no_result_number_or_count_is_written_by_hand_outside_the_block(name: str):
    """A signed difference (+1.05, −3.3) or a count ('9 of 12') outside the generated block would
    go stale without a test noticing: the page's words name rows and directions only."""
    page = (folder(name) / "README.md").read_text(encoding="utf-8")
    outside = page.split(BEGIN)[0] + page.split(END)[1]
    signed = re.findall(r".{0,30}(?<![\w/.~-])[+−-]\d+(?:\.\d+)?(?=[\s,;)%]|$)", outside)
    assert not signed, signed
    assert not re.findall(r"\b\d+ of (?:the )?\d+\b", outside)


def test_the_front_pages_results_rows_carry_their_tables_counts():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = {name: next(line for line in readme.splitlines() if line.startswith(f"| [{name}]")) for name in COMMITTED}
    for name, row in rows.items():
        assert readme_summary(read_frame(folder(name))) in row, name
        assert "trained to convergence" not in row and "inside seed noise" not in row
    frame = read_frame(folder("cpu-converged-2026-11-22")).drop(index="base")
    small = frame[frame["d_paper_ppl"].abs() < PAPER_THRESHOLD["ppl"]]
    beyond = small[small["beyond_noise"] == True]  # noqa: E712
    claim = f"of its {len(small)} differences too small to compare, {len(beyond)} are beyond noise in ours"
    assert claim in rows["cpu-converged-2026-11-22"]
    assert (beyond["d_ppl"] > 0).all()  # "all worse than base"


def test_the_counts_follow_the_table():
    """The summary counts what the table holds: flip one row's verdict and the words change."""
    frame = read_frame(folder("cpu-modifications-2026-11-26"))
    before = readme_summary(frame)
    changed = frame.copy()
    row = changed.index[(changed["beyond_noise"] == False).to_numpy()][0]  # noqa: E712
    changed.loc[row, "beyond_noise"] = True
    assert readme_summary(changed) != before and headline(changed) != headline(frame)
    assert isinstance(frame, pd.DataFrame)


def test_the_superseded_table_says_so_on_its_page_and_in_its_report():
    old = folder("cpu-2026-11-21")
    page = (old / "README.md").read_text(encoding="utf-8")
    assert page.splitlines()[2].startswith("> **Superseded**")
    for name in ("table3.md", "report.html"):
        assert "Superseded" in (old / name).read_text(encoding="utf-8"), name
    assert "`git checkout 77d3523~1`, then `ablate table3 --preset cpu --workers 2`" in page  # the preset as it was


@pytest.mark.parametrize("name", COMMITTED)
def test_no_committed_row_is_beyond_noise_while_its_seed_interval_spans_zero(name: str):
    """The issue's 'Done when': in both committed reports, a row called beyond noise on PPL or BLEU
    has a seed interval (from its archived runs alone) that excludes zero as well."""
    import json

    from reports.seeds import difference_ci

    runs = [json.loads(p.read_text()) for p in sorted((folder(name) / "archive").glob("*/results.json"))
            if "superseded" not in p.parent.name]
    frame = read_frame(folder(name))
    checked = 0
    for metric, column in (("ppl", "beyond_noise"), ("bleu", "bleu_beyond_noise")):
        base = {r["seed"]: r[metric] for r in runs if r["row"] == "base"}
        for row in frame.index[(frame[column] == True).to_numpy()]:  # noqa: E712
            seeds, _ = difference_ci({r["seed"]: r[metric] for r in runs if r["row"] == row}, base)
            assert seeds.excludes_zero, (row, metric, seeds)
            checked += 1
    assert checked >= 8  # both tables have rows beyond noise on PPL and on BLEU
