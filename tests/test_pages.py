"""What the results pages and the front page say about a committed table is what its table says:
each page's generated block is the one its report gives today, its headline is the report's first
sentence, no result number or count is written by hand outside the block, every sentence outside
it that names a row with a direction or a convergence class is one that a check here holds
against the table (`CLAIMS`), the front page's results row is the table's generated summary
after a description that says nothing of results, and the calibration page's table is its runs'."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from reports.agreement import signs
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


# words that say which way a row moved, or whether it converged
DIRECTION = re.compile(r"\b(better|worse|higher|lower|helps?|hurts?|gains?|los(?:es|e|t)|beats?|wins?|carry over|"
                       r"against|agrees?|match(?:es)?|converge[sd]?|convergence|overfits?|unstable|improving|slower|"
                       r"faster|costs?|costing)\b", re.I)


def test_the_front_pages_results_rows_are_their_tables_summaries():
    """Each committed table's row on the front page: a description of the table that says nothing of
    its results, then the summary generated from its table, ending the row (the row once added 'the
    paper's large effects carry over in direction', with three of the twelve clear rows against it)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for name in COMMITTED:
        row = next(line for line in readme.splitlines() if line.startswith(f"| [{name}]"))
        summary = readme_summary(read_frame(folder(name)))
        assert row.endswith(f"; {summary} |"), (name, row)
        description = row[:-len(f"; {summary} |")].split("|")[2]
        assert not DIRECTION.search(description), (name, description)
    assert not re.search(r"(?<!not each )to convergence", readme)  # the cpu preset trains a fixed number of steps


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


def _frame(name: str) -> pd.DataFrame:
    return read_frame(folder(name))


def _runs(name: str) -> list[dict]:
    """A committed table's runs as archived (the runs a redo set aside left out)."""
    return [json.loads(p.read_text()) for p in sorted((folder(name) / "archive").glob("*/results.json"))
            if "superseded" not in p.parent.name]


def _beyond(frame: pd.DataFrame, row: str) -> bool:
    return frame.loc[row, "beyond_noise"] == True  # noqa: E712 (read from CSV)


def _last_share_gain(curve: list[list[float]]) -> float:
    """How much a run's dev PPL fell over its last 20% of steps (the convergence rule's window)."""
    end = curve[-1][0]
    start = next(ppl for step, ppl in curve if step >= 0.8 * end - 1)
    return start - curve[-1][1]


def _attention_heads_lag() -> bool:
    """gqa and mqa: every seed behind base's seed at every evaluation, and gaining over its last
    20% less than half its gap to base at the end."""
    runs = _runs("cpu-modifications-2026-11-26")
    base = {r["seed"]: dict(r["dev_ppl_curve"]) for r in runs if r["row"] == "base"}
    for r in (r for r in runs if r["row"] in ("gqa", "mqa")):
        theirs, curve = base[r["seed"]], r["dev_ppl_curve"]
        if not all(ppl > theirs[step] for step, ppl in curve if step in theirs):
            return False
        if not _last_share_gain(curve) < 0.5 * (curve[-1][1] - theirs[curve[-1][0]]):
            return False
    return True


def _params_removed(name: str, row: str) -> int:
    frame = _frame(name)
    return round(1e6 * (frame.loc["base", "params_m"] - frame.loc[row, "params_m"]))


T3, MODS = "cpu-converged-2026-11-22", "cpu-modifications-2026-11-26"
# Each results page's sentences outside its generated block that name a row with a direction or a
# class: a fragment of the sentence (whitespace as one space) and what must hold in the tables.
CLAIMS = {
    T3: {
        "Why a table where every change is worse scores within a row of ours":
            lambda: 0 <= signs(_frame(T3)).agree - signs(_frame(T3)).every_change_hurts <= 1,
        "big (which largely ignores its source, `probes/source_probe.py`) and no label smoothing (D3) go against the "
        "paper beyond noise":
            lambda: all(_beyond(_frame(T3), r) and _frame(T3).loc[r, "ppl_sign_agrees"] == False  # noqa: E712
                        for r in ("big", "D3")),
        "more capacity (C3, C5, big) does not help":
            lambda: all(_frame(T3).loc[r, "d_ppl"] > 0 for r in ("C3", "C5", "big")),
        "Every still-improving run improved by less than 1.5% over its last 20% of steps":
            lambda: all(_last_share_gain(r["dev_ppl_curve"]) < 0.015 * r["dev_ppl_curve"][-1][1] or
                        "still improving" not in str(_frame(T3).loc[r["row"], "convergence"]) for r in _runs(T3)),
        "D1 overfits": lambda: _frame(T3).loc["D1", "convergence"] == "overfitting",
        "D3's one unstable seed": lambda: _frame(T3).loc["D3", "convergence"] == "unstable (1/3)",
    },
    MODS: {
        "here swiglu is lower in PPL than base beyond noise, and geglu, rmsnorm and gelu lower within noise":
            lambda: (_beyond(_frame(MODS), "swiglu") and _frame(MODS).loc["swiglu", "d_ppl"] < 0
                     and all(not _beyond(_frame(MODS), r) and _frame(MODS).loc[r, "d_ppl"] < 0
                             for r in ("geglu", "rmsnorm", "gelu"))),
        "learned is within noise, as Table 3's row E is":
            lambda: not _beyond(_frame(MODS), "learned") and not _beyond(_frame(T3), "E"),
        "modern gains less than rope alone and holds pre_ln, which is worse":
            lambda: (_frame(MODS).loc["rope", "d_ppl"] < _frame(MODS).loc["modern", "d_ppl"] < 0
                     and _frame(MODS).loc["pre_ln", "d_ppl"] > 0),
        "untied carries 0.26M more parameters than base on 18,347 pairs; mqa is worse than gqa":
            lambda: (round(-_params_removed(MODS, "untied") / 1e6, 2) == 0.26
                     and _frame(MODS).loc["mqa", "d_ppl"] > _frame(MODS).loc["gqa", "d_ppl"] > 0),
        "**The rows that did not converge, explained, not tuned.**":
            lambda: all(_frame(MODS).loc[r, "convergence"] != "converged" for r in ("unscaled", "gqa", "mqa")),
        "gqa and mqa: every seed is behind base's seed at every evaluation": _attention_heads_lag,
        "gqa removes 56,160, as many as Table 3's B1, and C6 removes 99,072, both costing less PPL":
            lambda: (_params_removed(MODS, "gqa") == _params_removed(T3, "B1") == 56_160
                     and _params_removed(T3, "C6") == 99_072
                     and max(_frame(T3).loc[r, "d_ppl"] for r in ("B1", "C6")) < _frame(MODS).loc["gqa", "d_ppl"]),
    },
}
CALIBRATION = REPO / "reports" / "results" / "calibration-2026-11-22"
CLAIMS["calibration-2026-11-22"] = {
    "Only 24,000 steps converge by the rule":  # of the calibration runs, by their stored class
        lambda: [json.loads(p.read_text())["steps"] for p in sorted(CALIBRATION.glob("*.results.json"))
                 if json.loads(p.read_text())["convergence"] == "converged"] == [24_000],
}
TUNED = "cpu-tuned-2026-12-02"  # the tuned table's rows, chosen from the converged one's verdicts


def _agrees(row: str) -> bool | None:
    value = _frame(T3).loc[row, "ppl_sign_agrees"]
    return None if pd.isna(value) else bool(value)


def _tuning() -> pd.DataFrame:
    return pd.read_csv(folder(TUNED) / "report" / "tuning.csv", dtype=str, keep_default_na=False).set_index("row")


def _kept_verdicts_and_signs() -> bool:
    t = _tuning().drop(index="base")
    same_sign = t["sign = paper"].map(lambda v: len(set(v.split(" → "))) == 1)
    return bool((t["verdict at its own value"] == t["verdict at its best value"]).all() and same_sign.all())


CLAIMS[TUNED] = {
    "Sign against the paper's, at its own value → at its best:": _kept_verdicts_and_signs,
    "the decided rows keep their verdicts and their signs against the paper's, D3's included":
        lambda: _kept_verdicts_and_signs() and "D3" in _tuning().index,
    "the three rows whose sign disagrees with the paper's (big, C5, D3)":
        lambda: {row for row in _frame(T3).index if _agrees(row) is False} == {"big", "C5", "D3"},
    "two rows that agree with it beyond noise, B1 (d_k 16) and C6 (d_ff 1024)":
        lambda: all(_agrees(row) and _beyond(_frame(T3), row) and _frame(T3).loc[row, "seeds"] == 3
                    for row in ("B1", "C6")),
    "A1 and C7 agree in sign but are within noise":
        lambda: all(_agrees(row) and not _beyond(_frame(T3), row) for row in ("A1", "C7")),
}
ALL_PAGES = sorted(p.parent.name for p in (REPO / "reports" / "results").glob("*/README.md"))


def _sentences(page: str) -> list[str]:
    """The page's prose outside its generated block, sentence by sentence (bullets and paragraphs
    apart; its indented commands left out), whitespace as one space."""
    text = page.split(BEGIN)[0] + page.split(END)[1] if BEGIN in page else page
    prose = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    parts = re.split(r"\n\s*\n|\n- |(?<=\.)\s+(?=[A-Z*`(\[])", prose)
    return [" ".join(part.split()).removeprefix("- ") for part in parts if part.strip()]


def _row_names() -> set[str]:
    return {row for name in COMMITTED for row in _frame(name).index if row != "base"}


@pytest.mark.parametrize("name", ALL_PAGES)
def test_every_sentence_that_names_a_row_with_a_direction_is_checked_against_the_table(name: str):
    """Outside the generated block, a sentence that names a row (of any committed table) and says
    which way it moved or how it converged must hold one of its page's `CLAIMS`, and each claim is
    on the page and true of the tables: a claim that goes stale, or a new one without a check,
    fails here (the superseded page's 'bigger models win' went unchecked)."""
    page = (folder(name) / "README.md").read_text(encoding="utf-8")
    claims = CLAIMS.get(name, {})
    rows = re.compile(r"(?<![\w/.-])(" + "|".join(map(re.escape, sorted(_row_names(), key=len, reverse=True)))
                      + r")(?![\w/-])")
    unchecked = [s for s in _sentences(page) if rows.search(s) and DIRECTION.search(s)
                 and not any(fragment in s for fragment in claims)]
    assert not unchecked, unchecked
    flat = " ".join(page.split())
    for fragment, holds in claims.items():
        assert fragment in flat, f"{name}: the page no longer says {fragment!r}"
        assert holds(), f"{name}: the tables no longer support {fragment!r}"


def test_a_claim_check_fails_when_the_table_disagrees():
    """The check of a claim is a real one: the converged page's 'D3 ... against the paper beyond
    noise' fails on a table where D3 is within noise, and an unchecked directional sentence is
    found."""
    frame = _frame(T3)
    assert _beyond(frame, "D3")
    frame.loc["D3", "beyond_noise"] = False
    assert not _beyond(frame, "D3")
    page = "Intro.\n\n" + BEGIN + "\n" + END + "\n- C5 is better than base here. And C3 helps.\n"
    rows = re.compile(r"(?<![\w/.-])(C5|C3)(?![\w/-])")
    flagged = [s for s in _sentences(page) if rows.search(s) and DIRECTION.search(s)]
    assert flagged == ["C5 is better than base here.", "And C3 helps."]


@pytest.mark.parametrize("name", COMMITTED)
def test_a_committed_reports_page_names_the_code_version_its_commands_reproduce_with(name: str):
    """The page says which code rebuilds its report byte for byte: the commit that last wrote the
    report, named by a git command over this very folder (a hash written there would change with
    every rebase); the slow test of tests/test_reproduce.py rebuilds it at that code."""
    page = " ".join((folder(name) / "README.md").read_text(encoding="utf-8").split())
    assert (f"byte for byte with the code of the commit that last wrote it, "
            f"`git log -n 1 --format=%h -- reports/results/{name}/report.html`") in page


def test_the_calibration_pages_table_is_its_runs():
    """Each row of the calibration page's table that names a run's results.json gives that run's
    dev PPL, dev BLEU, class and its improvement over the last 20% as the run stored them."""
    root = REPO / "reports" / "results" / "calibration-2026-11-22"
    page = (root / "README.md").read_text(encoding="utf-8")
    checked = 0
    for line in page.splitlines():
        if not line.startswith("| ") or "`cpu-base" not in line:
            continue
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        stem = re.search(r"`(cpu-base[^`*]*?)\.[*]", cells[-1])
        if not stem or not (root / f"{stem.group(1)}.results.json").exists():
            continue
        run = json.loads((root / f"{stem.group(1)}.results.json").read_text())
        assert float(cells[1]) == round(run["ppl"], len(cells[1].split(".")[1])), (stem.group(1), cells[1])
        assert float(cells[2]) == round(run["bleu"], 1), (stem.group(1), cells[2])
        share = re.search(r"improved ([\d.]+%)", run["convergence_reason"]).group(1)
        assert cells[3] == f"{run['convergence']} ({share})", (stem.group(1), cells[3])
        checked += 1
    assert checked == 4


def test_the_tuned_tables_page_says_what_its_report_decided():
    """The tuned table in progress (#74): the page's lines on the decided rows are its report's
    `tuning.csv` (each row's value chosen against its own, where it was, the verdicts), the rows
    not decided are named as such, and no verdict is called dependent on tuning by hand."""
    tuned = folder("cpu-tuned-2026-12-02")
    table = pd.read_csv(tuned / "report" / "tuning.csv", dtype=str, keep_default_na=False).set_index("row")
    page = (tuned / "README.md").read_text(encoding="utf-8")
    kept = [row for row, r in table.iterrows() if r["chosen"] == r["own value"]]
    moved = [row for row, r in table.iterrows() if r["chosen"] != r["own value"]]
    edge = [f"{row} ({r['at the edge']})" for row, r in table.iterrows() if r["at the edge"]]
    assert f"- **Kept their own value** ({table['own value'].iloc[0]}): {', '.join(kept) or 'none'}." in page
    assert f"- **Moved to another value:** {', '.join(moved) or 'none'}." in page
    assert f"- **Depends on tuning:** {', '.join(table.index[table['depends on tuning'] == 'yes']) or 'none'}." in page
    assert f"- **Chosen value at the edge of those tried:** {', '.join(edge) or 'none'}." in page
    signs = ", ".join(f"{row} {r['sign = paper']}" for row, r in table.iterrows() if r["sign = paper"] != "– → –")
    assert f"- **Sign against the paper's, at its own value → at its best:** {signs}." in page
    planned = ["base", "big", "C5", "D3", "B1", "C6"]
    assert f"- **Not decided yet:** {', '.join(r for r in planned if r not in table.index) or 'none'}." in page
