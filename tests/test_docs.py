"""The documentation holds together: README.md is a front page, docs/ has one page per topic, and
every relative link in them leads somewhere real.

- every relative link (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`) in README.md,
  docs/*.md, the benchmark index and the results pages names an existing file or folder, and an
  anchor names a heading of the linked page;
- docs/tests.md has a row for every test file;
- README.md is at most 250 lines, a results page (reports/results/*/README.md) at most 80: history
  belongs in the LOG.md beside it;
- README.md and docs/ carry no commit hash, no session diary ("sitting") and no dated figure: dated
  measurements live in their results folder's page;
- each "adding" section (a corpus, a report figure, a storage) names its one place and its test,
  and both exist;
- the time README.md and docs/tests.md give for `make test` is the newest measured one
  (benchmarks/results/test-suite-cpu-*/results.json), in whole minutes, and the index's row its
  figures, beside the measurement before on another CPU; README's time for `make demo` likewise
  (demo-cpu-*/results.json), and its excerpt of the demo's table is the newest measured table3.md.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from conftest import measurements, newest_measurement

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
INDEX = ROOT / "benchmarks" / "results" / "README.md"  # links checked too; dated by nature
TESTS_PAGE = ROOT / "docs" / "tests.md"
RESULTS_PAGES = sorted((ROOT / "reports" / "results").glob("*/README.md"))

README_MAX_LINES = 250
RESULTS_PAGE_MAX_LINES = 80

# [text](target) or [text](target "title"); images ![..](..) too. Code spans and fenced blocks are
# left out first: a `[x](y)` inside code is an example, not a link.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
# a commit hash: 7 to 40 hex digits with at least one digit and one letter (so that neither a
# number like 5242880 nor a word like "defaced" counts)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
SITTING = re.compile(r"\bsittings?\b", re.I)
# a date standing alone ("on 2026-11-26"), not part of a dated folder's name (".../cpu-2026-11-21/")
DATE = re.compile(r"(?<![\w/-])20\d\d-\d\d-\d\d(?![\w-])")


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text(encoding="utf-8")))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, https:, mailto: are not ours


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_docs_exist_and_readme_links_them() -> None:
    assert DOCS, "docs/ has no pages"
    linked = {(README.parent / t.split("#")[0]).resolve() for t in relative_links(README) if t.split("#")[0]}
    missing = [rel(p) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README.md does not link these docs pages: {missing}"


@pytest.mark.parametrize("page", [*PAGES, INDEX, *RESULTS_PAGES], ids=rel)
def test_every_relative_link_resolves(page: Path) -> None:
    links = relative_links(page)
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file or folder")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {rel(dest)}")
        elif anchor and dest.suffix != ".md":
            broken.append(f"{target}: an anchor into a file that is not markdown")
    assert not broken, f"{rel(page)}: broken links:\n  " + "\n  ".join(broken)


def test_the_link_checker_catches_a_broken_link(tmp_path: Path) -> None:
    """The checker itself: a missing file and a missing anchor are both found, good links are not."""
    (tmp_path / "other.md").write_text("# A heading, with `code`\n\n## Twice\n## Twice\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#a-heading-with-code) [b](other.md#twice-1) [c](missing.md) "
                    "[d](other.md#nowhere) `[e](in-code.md)` [f](https://example.org/x)\n", encoding="utf-8")
    assert relative_links(page) == ["other.md#a-heading-with-code", "other.md#twice-1", "missing.md",
                                    "other.md#nowhere"]
    assert {"a-heading-with-code", "twice", "twice-1"} <= anchors(tmp_path / "other.md")


def test_every_test_file_is_described() -> None:
    """docs/tests.md says what each test file checks: a new file gets its row there."""
    text = TESTS_PAGE.read_text(encoding="utf-8")
    missing = [p.name for p in sorted((ROOT / "tests").glob("test_*.py")) if f"`{p.name}`" not in text]
    assert not missing, f"docs/tests.md has no row for {missing}"


def test_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_readme_starts_with_the_two_commands() -> None:
    head = "\n".join(README.read_text(encoding="utf-8").splitlines()[:20])
    assert "make demo" in head and "make test" in head


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_no_commit_hashes_diary_or_dated_figures(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        for rule, pattern in (("a commit hash", COMMIT), ('"sitting"', SITTING), ("a date", DATE)):
            if m := pattern.search(line):
                problems.append(f"line {number}: {rule} ({m.group(0)!r})")
    assert not problems, (f"{rel(page)}: dated or session-specific content belongs in a results folder's "
                          "page (reports/results/*/, benchmarks/results/*/):\n  " + "\n  ".join(problems))


def test_the_patterns_catch_what_they_should() -> None:
    assert COMMIT.search("at ddf6508 later") and COMMIT.search("a5e5899") and not COMMIT.search("defaced")
    assert not COMMIT.search("5242880") and not COMMIT.search("63,082,496")
    assert SITTING.search("Sittings on machines") and not SITTING.search("babysitting")
    assert DATE.search("on 2026-11-26, 12 min") and not DATE.search("reports/results/cpu-2026-11-21/")


@pytest.mark.parametrize("page", RESULTS_PAGES, ids=rel)
def test_results_pages_are_short(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").count("\n")
    assert lines <= RESULTS_PAGE_MAX_LINES, (
        f"{rel(page)} has {lines} lines (at most {RESULTS_PAGE_MAX_LINES}): "
        "the table, how to read it, the command and its cost; history goes in LOG.md beside it")


def test_results_pages_exist() -> None:
    assert RESULTS_PAGES, "no reports/results/*/README.md found"


def measurement(kind: str) -> tuple[Path, dict]:
    """conftest's `newest_measurement(kind)`, which must exist."""
    found = newest_measurement(kind)
    assert found, f"no benchmarks/results/{kind}-*/results.json"
    return found


def measurement_before(kind: str) -> tuple[Path, dict]:
    """The newest benchmarks/results/KIND-*/results.json taken on another device than the newest one
    (the pages give both: the same code takes twice as long on one 2-core CPU as on another), which
    must exist."""
    newest, figures = measurement(kind)
    earlier = ((path, json.loads(path.read_text())) for path in reversed(measurements(kind)))
    found = next(((path, f) for path, f in earlier if f["device"] != figures["device"]), None)
    assert found, f"no {kind} measurement on another device than {rel(newest.parent)}'s"
    return found


def base_ppl(figures: dict) -> float:
    """The base row's dev PPL in a demo measurement's figures."""
    return next(r["dev_ppl"] for r in figures["rows"] if r["row"] == "base")


def index_row(start: str) -> str:
    """The benchmark index's row that starts with `start` (empty if none)."""
    return next((line for line in INDEX.read_text(encoding="utf-8").splitlines() if line.startswith(start)), "")


def test_the_time_make_test_is_said_to_take_is_the_newest_measured_one() -> None:
    """The newest fresh-clone measurement, rounded to whole minutes in the sentence of each page that
    says how long `make test` takes, and as it is in the benchmark index's row; beside it, the time of
    the measurement before on another, slower CPU."""
    path, figures = measurement("test-suite-cpu")
    before, earlier = measurement_before("test-suite-cpu")
    assert earlier["make_test_wall_s"] > figures["make_test_wall_s"], "the pages call the CPU before slower"
    minutes = round(figures["make_test_wall_s"] / 60)
    row = index_row("| `make test`")
    assert (f"{figures['make_test_wall_s'] / 60:.1f} min (set-up {figures['setup_s'] / 60:.1f}, "
            f"pytest {figures['pytest_wall_s'] / 60:.1f}); {figures['test_time_s']:,.0f} s of test time") in row \
        and path.parent.name in row, f"the index's make test row is not {rel(path)}'s"
    assert f"{earlier['make_test_wall_s'] / 60:.1f} min on the slower CPU before" in row and before.parent.name in row, \
        f"the index's make test row does not give {rel(before)}'s time"
    for page in (README, TESTS_PAGE):
        text = " ".join(page.read_text(encoding="utf-8").split())
        said = re.findall(r"about (\d+) minutes on 2 cores[^.;]*?set-up included.*?and about (\d+) on the slower "
                          r"2-core CPU of", text)
        assert said == [(str(minutes), str(round(earlier["make_test_wall_s"] / 60)))], (
            f"{rel(page)} says make test takes about {said} minutes on 2 cores; {rel(path.parent)} measured "
            f"{minutes}, {rel(before.parent)} {round(earlier['make_test_wall_s'] / 60)}")


def test_the_time_make_demo_is_said_to_take_is_the_newest_measured_one() -> None:
    """The front page's time for `make demo`, in whole minutes, set-up included and once set up, and
    the benchmark index's row: the newest fresh-clone measurement's; beside it, the measurement before
    on another, slower CPU."""
    path, figures = measurement("demo-cpu")
    before, earlier = measurement_before("demo-cpu")
    assert earlier["make_demo_wall_s"] > figures["make_demo_wall_s"], "README calls the CPU before slower"
    text = " ".join(README.read_text(encoding="utf-8").split())
    said = re.findall(r"`make demo` takes about (\d+) minutes on a 2-core CPU, set-up included\*\* \(about (\d+) once "
                      r"set up; on the slower 2-core CPU of the measurement before, about (\d+)\)", text)
    measured = (str(round(figures["make_demo_wall_s"] / 60)), str(round(figures["table_s"] / 60)),
                str(round(earlier["make_demo_wall_s"] / 60)))
    assert said == [measured], f"README says make demo takes {said} minutes; {rel(path.parent)} and " \
                               f"{rel(before.parent)} measured {measured}"
    row = index_row("| `make demo`")
    assert (f"{figures['make_demo_wall_s'] / 60:.1f} min (set-up {figures['setup_s'] / 60:.1f}, "
            f"the table {figures['table_s'] / 60:.1f})") in row and path.parent.name in row, \
        f"the index's make demo row is not {rel(path)}'s"
    assert f"{earlier['make_demo_wall_s'] / 60:.1f} min and {base_ppl(earlier)} on the slower CPU before" in row \
        and before.parent.name in row, f"the index's make demo row does not give {rel(before)}'s figures"


def markdown_rows(text: str) -> dict[str, dict[str, str]]:
    """The first markdown table in `text` that starts with a `row` column: row -> column -> cell."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    start = next(i for i, line in enumerate(lines) if line.split("|")[1].strip() == "row")
    head = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) != len(head):
            break
        rows[cells[0]] = dict(zip(head, cells))
    return rows


def test_the_demo_excerpt_and_what_readme_says_of_it_are_the_newest_measured_demo_table() -> None:
    """README's excerpt of the demo's table3.md: every cell it shows is that cell of the newest
    measurement's table3.md (kept in its folder), on the vector kernels it names; the rows it calls
    lowest in dev PPL and its Spearman ρ are that table's; the base PPL it gives for the CPU without
    AVX-512 is the measurement before's."""
    path, figures = measurement("demo-cpu")
    _, earlier = measurement_before("demo-cpu")
    measured = (path.parent / "table3.md").read_text(encoding="utf-8")
    readme = README.read_text(encoding="utf-8")
    demo = readme[readme.index("`make demo` takes about"):readme.index("## Train one model")]
    text = " ".join(demo.split())
    shown, table = markdown_rows(demo), markdown_rows(measured)
    assert len(shown) >= 3 and "base" in shown
    for row, cells in shown.items():
        for column, cell in cells.items():
            assert table[row][column] == cell, f"README's demo excerpt, {row} {column}: {cell!r}, measured {table[row][column]!r}"
    assert "on a CPU running ATen's AVX-512 kernels" in text and "ATen AVX512" in figures["device"]
    ppl = {row: float(cells["PPL (paper)"].split()[0]) for row, cells in table.items()}
    (lowest,) = re.findall(r"the lowest dev PPL: (\w+), (\w+) and (\w+);", text)
    assert set(lowest) == set(sorted(ppl, key=ppl.get)[:3]), (lowest, ppl)
    (rho,) = re.findall(r"Spearman ρ of dev PPL with the paper's ordering over the ten rows: (−?[\d.]+)\)", text)
    (measured_rho,) = re.findall(r"dev PPL (-?[\d.]+) over 10 rows", measured)
    assert float(rho.replace("−", "-")) == round(float(measured_rho), 2)
    (other,) = re.findall(r"base reads ([\d.]+) on the CPU without AVX-512 of the measurement before", text)
    assert float(other) == base_ppl(earlier)


# Each "adding" section: (page, its heading's anchor) -> the one place to change (file, top-level
# name) and the test that checks it (file, test function).
ADDING = {
    ("corpora.md", "adding-a-corpus"): ("lightning_modules/config.py", "CORPORA", "tests/test_data.py",
                                        "test_every_registered_corpus_names_a_loader_of_the_data_package"),
    ("table3.md", "adding-a-report-figure"): ("reports/figures.py", "FIGURES", "tests/test_figures.py",
                                              "test_no_label_covers_another_in_any_figure_of_a_committed_report"),
    ("scale-out.md", "adding-a-storage"): ("sweeps/storage.py", "make_storage", "tests/test_storages.py",
                                           "test_a_killed_workers_trial_is_failed_and_retried_by_the_heartbeat"),
}


def section(page: Path, anchor: str) -> str:
    """The text under the heading with `anchor`, up to the next heading of its level or above."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    headings = list(HEADING.finditer(text))
    for i, m in enumerate(headings):
        if slug(m.group(2)) == anchor:
            end = next((h.start() for h in headings[i + 1:] if len(h.group(1)) <= len(m.group(1))), len(text))
            return text[m.end():end]
    raise AssertionError(f"{rel(page)} has no heading with anchor #{anchor}")


def top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return ({n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            | {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)})


@pytest.mark.parametrize(("page", "anchor"), list(ADDING), ids=[a for _, a in ADDING])
def test_an_adding_section_names_its_one_place_and_its_test_and_both_exist(page: str, anchor: str) -> None:
    source, name, test_file, test = ADDING[page, anchor]
    text = section(ROOT / "docs" / page, anchor)
    assert f"`{name}`" in text and f"`{source}`" in text and f"`{test}`" in text and f"`{test_file}`" in text, \
        f"docs/{page}#{anchor} should name `{name}` in `{source}` and `{test}` in `{test_file}`"
    assert name in top_level_names(ROOT / source), f"{source} has no top-level {name}"
    assert f"def {test}(" in (ROOT / test_file).read_text(encoding="utf-8"), f"{test_file} has no {test}"
