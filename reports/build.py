"""`ablate report`: the Table 3 report, from the database alone.

Writes `table3.csv` (numbers), `table3.md`, `table3.tex`, `figures/*.png` and a self-contained
`report.html`, each atomically; the same inputs give the same bytes (no timestamps; sacreBLEU's
bootstrap has a fixed seed). The report answers first: any caveats, then "What this table says"
(a verdict per group and, where the spec has the paper's numbers, the rank correlation with
them), then the table, the figures, and the methods last (collapsed in report.html). With W&B on,
one run logs the table (`wandb.Table`), every figure, report.html, and the report's opening lines
(the run's notes, and a table of lines).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lightning_modules.convergence import ConvergenceRule
from foundation.errors import UserError
from ablations.spec import table3_section
from foundation.names import inside
from foundation.io import check_writable_dir, disk_full_ends_the_run, first_missing, not_a_link
from foundation.rundir import mark, refuse_foreign
from reports import figures as figs
from reports.attention import group_attention_pictures
from reports.collect import Table3Data, load_table3
from reports.html import FIGURES, METHODS, SUMMARY, TABLE, TUNED, lead, render
from reports import trajectory, tuning
from reports.agreement import N_PERMUTATIONS, spearman
from reports.significance import ALPHA, check_bootstrap_budget, family_size, missing_sentences, sentence_draws
from reports.seeds import PAPER_THRESHOLD
from reports.table3 import display_frame, has_paper, table3_frame, to_latex, to_markdown
from reports.verdicts import headline, verdicts


def caption(data: Table3Data, frame: pd.DataFrame) -> str:
    setup: dict[str, Any] = data.setup
    scale = setup.get("scale", {})
    seeds = sorted(set(data.runs["seed"]))
    return (f"Study {data.study}, preset {data.preset} (one rule for every row: widths x {scale.get('width')}, "
            f"N x {scale.get('depth')}, steps x {scale.get('steps')}); corpus {setup.get('corpus')}, "
            f"shared BPE vocabulary {setup.get('vocab_size')}; dev perplexity per wordpiece and dev BLEU "
            f"(sacreBLEU, beam {setup.get('beam_size')}, alpha {setup.get('length_penalty')}); "
            f"{len(frame)} rows, seeds {', '.join(map(str, seeds))}. The configuration is at the paper's "
            f"scale (before the preset's rule), shown only where a row changes base; PPL/BLEU/params/time "
            f"are ours (mean ± 95% CI over seeds)" + (" beside the paper's." if has_paper(frame) else "."))


def preset_note(preset: str) -> str | None:
    """The preset's own word on what its table is (`table3: {note: ...}` in its YAML), if any."""
    try:
        return table3_section(preset).get("note")
    except UserError:  # a preset of another installation: nothing to add
        return None


def missing_base(data: Table3Data) -> str | None:
    """What a report lacks without a complete base run (None when it has one)."""
    if "base" in set(data.runs["row"]):
        return None
    return (f"study {data.study!r} has no complete base run, so the report has each row's PPL and BLEU "
            f"but no change against base (Δ, its interval, sign, p-value, verdicts); run base to complete it")


def unclassified(runs: pd.DataFrame) -> str | None:
    """How many runs the report cannot classify: they stored no inputs of the convergence rule."""
    if "convergence" not in runs or not (missing := int(runs["convergence"].isna().sum())):
        return None
    return (f"{missing} of the {len(runs)} runs stored none of the convergence rule's inputs (trained "
            f"before runs kept them), so their class is left blank")


def redone(data: Table3Data) -> list[str]:
    """Which runs a redo replaced (with their numbers and the new ones), and which it is replacing."""
    if data.redone.empty:
        return []
    new = data.runs.set_index(["row", "seed"])
    out = []
    if not (done := data.redone[data.redone["done"]]).empty:
        changes = "; ".join(
            f"{r.row} seed {r.seed}: dev PPL {r.ppl} → {new.loc[(r.row, r.seed), 'ppl']}, BLEU {r.bleu} → "
            f"{new.loc[(r.row, r.seed), 'bleu']} (trial {r.by} replaces {r.trial}, kept as {r.kept_as})"
            for r in done.itertuples())
        out.append(f"Redone (`ablate table3 --redo`), and the table uses the new runs: {changes}. The replaced "
                   f"runs stay in the study, and their files in the folder named, beside the run directory "
                   f"and in the table's archive (--archive)")
    if not (pending := data.redone[~data.redone["done"]]).empty:
        listed = ", ".join(f"{r.row} seed {r.seed} (trial {r.trial})" for r in pending.itertuples())
        out.append(f"Redo not complete: the table still uses the runs it replaces, {listed}")
    return out


def caveats(data: Table3Data, frame: pd.DataFrame | None = None) -> list[str]:
    """What a reader must know before reading the numbers, shown first in the report: a table still
    running, one without base, rows whose PPL is not comparable with base's, the preset's own word
    on what its table is (demo: a smoke test)."""
    out = []
    if other := (frame.attrs.get("other_vocabulary") if frame is not None else None):
        rows = ", ".join(f"{row} ({size:,} against {base:,})" for row, (size, base) in other.items())
        out.append(f"Not comparable in PPL: {rows} trained with another BPE vocabulary than base's, so a "
                   f"wordpiece is another unit; their PPL is not compared with base's (their BLEU is).")
    if (planned := sum(data.planned.values())) > len(data.runs):
        out.append(f"In progress: {len(data.runs)} of the {planned} runs queued are complete; a row "
                   f"short of its seeds shows 'k of n' in 'seeds', and its mean and interval are over "
                   f"the k done.")
    if gap := missing_base(data):
        out.append(f"Incomplete: the {gap}.")
    if data.tuning and (undecided := [row for row in data.spec if row in data.planned and row not in data.tuned_rows]):
        out.append(f"Tuning in progress: the tuning of {', '.join(undecided)} has not finished, so the tuned "
                   f"table leaves them out.")
    if note := preset_note(data.preset):
        out.append(note)
    return out


def summary(frame: pd.DataFrame, tuned: str | None = None) -> list[tuple[str, str]]:
    """What the report opens with ("What this table says"), as (kind, line): the headline sentence
    (and a tuned table's count of the rows whose verdict depends on tuning: `tuned`), one verdict per
    group (`reports.verdicts`), then how our ordering of the rows agrees with the paper's."""
    out = [("headline", line[:-1] + f"; {tuned}." if tuned else line)] if (line := headline(frame)) else []
    out += [(f"verdict {group}", sentence) for group, sentence in verdicts(frame).items() if sentence]
    if not has_paper(frame):
        return out  # a spec without the paper's numbers (ablations/modifications.yaml): nothing to rank against
    ranks = [f"{name} {spearman(frame, metric, f'paper_{metric}').text()}"
             for metric, name in (("ppl", "dev PPL"), ("bleu", "dev BLEU"))]
    converged = frame[frame["convergence"] == "converged"] if "convergence" in frame else frame.iloc[:0]
    if len(converged) >= 3:
        ranks[0] += f" ({spearman(converged, 'ppl', 'paper_ppl').text('converged rows only')})"
    out.append(("rank correlation", f"Spearman rank correlation with the paper's: {'; '.join(ranks)}."))
    return out


def methods(data: Table3Data, frame: pd.DataFrame, n_bootstrap: int,
            draws: dict[tuple[str, int], Any] | None = None) -> list[str]:
    """The notes at the end of the report: the one significance test first, then how to read the
    table's columns (intervals, convergence classes and the rule), the sacreBLEU signature, redos,
    setups and devices."""
    sentences = (f"a paired bootstrap of the dev sentences ({n_bootstrap} resamples, seeded, the same for "
                 f"every run, BLEU from sacreBLEU's sentence statistics)" if n_bootstrap and draws
                 else "no sentence level (--bootstrap 0)" if not n_bootstrap
                 else "no sentence level (no run carries base's dev translations)")
    out = [f"Beyond noise, for dev PPL and dev BLEU alike, means that the 95% interval of the row's "
           f"difference to base excludes zero, where the interval is Student's t over the seeds (paired "
           f"by seed when the seeds match, Welch otherwise) with the dev sentences' variance added from "
           f"{sentences}; dev PPL per sentence is not stored by a run, so PPL's interval has the seed "
           f"level only; a one-seed row against several of base's seeds assumes it is as noisy as base "
           f"(base's 95% prediction interval for one more run), and one seed on both sides gets no interval."]
    out.append("± is the 95% t interval of the mean over seeds; Δ [95% CI] is the difference to base with "
               "that test's interval, never narrower than the seeds' own, so no difference within seed "
               "noise is called beyond noise.")
    if (family := family_size(frame)):
        out.append(f"Multiple comparisons: the family is every comparison of a row with base that has an interval, "
                   f"{family} here (rows × dev PPL and dev BLEU); each one's p is its test's two-sided t p-value, "
                   f"and q its Benjamini–Hochberg adjusted p over the family (scipy), shown beside 'beyond noise'. "
                   f"The headline's first counts are each comparison's own 95% interval; its next, those with "
                   f"q < {ALPHA}, of which at most 5% are expected to be no difference at all.")
    if has_paper(frame):
        out.append(f"'sign = paper' compares our ΔPPL's sign with the paper's where the paper's "
                   f"|ΔPPL| ≥ {PAPER_THRESHOLD['ppl']} (smaller printed differences are within what a "
                   f"second single run could change). Its baselines: a table where every change is worse than "
                   f"base agrees on exactly the rows the paper found worse, and random signs reach k of n with the "
                   f"binomial probability (one-sided). Spearman's ρ has a one-sided permutation p "
                   f"({N_PERMUTATIONS} random pairings of our values with the paper's, seeded).")
    if n_bootstrap and (why := missing_sentences(data, draws or {})):
        out.append(f"{why}.")
    if "convergence" in frame and frame["convergence"].notna().any():
        out.append(f"Convergence rule: {ConvergenceRule().describe()}. Column 'converged': the worst "
                   "class over a row's seeds (with how many seeds had it); in report.html its cell is coloured: green "
                   "converged, yellow still improving, orange overfitting, red unstable or diverged, grey unknown.")
    if "verdict_moving" in frame and frame["verdict_moving"].notna().any():
        out += trajectory.rules()
    if why := unclassified(data.runs):
        out.append(f"{why}.")
    signatures = sorted(set(data.runs["sacrebleu_signature"].dropna()))
    out += [f"sacreBLEU signature: {s}" for s in signatures]
    out += [f"{line}." for line in redone(data)]
    setups = sorted(set(data.runs["setup"].dropna())) if "setup" in data.runs else []
    if len(setups) > 1:
        out.append(f"The runs come from {len(setups)} different setups (the same seed on another CPU, "
                   f"thread count or precision gives slightly different numbers, so seed intervals "
                   f"mix in that difference): " + " | ".join(setups))
    elif setups:
        out.append(f"Every run on one setup: {setups[0]}")
    devices = sorted(set(data.runs["device"].dropna()))
    out.append(f"Device: {', '.join(devices) or 'unknown'}; storage {data.storage}")
    if data.overrides:
        out.append(f"Overrides for every row: {' '.join(data.overrides)}")
    return out


def markdown_report(title: str, cap: str, frame: pd.DataFrame, summary_lines: Sequence[str],
                    method_lines: Sequence[str], figure_names: Sequence[str],
                    caveat_lines: Sequence[str] = (), tuned: tuple[str, pd.DataFrame] | None = None) -> str:
    """The report in markdown, in the order of report.html: caveats, what the table says, the
    table (and a tuned table's tuning: `tuned`, its statement and table), the figures, the methods."""
    parts = [f"# {title}", ""]
    parts += [f"> **{line}**\n" for line in caveat_lines]
    if summary_lines:
        parts += [f"## {SUMMARY}", ""] + [f"- **{head}**: {rest}" if head else f"- {rest}"
                                           for head, rest in map(lead, summary_lines)] + [""]
    parts += [f"## {TABLE}", "", cap, "", to_markdown(frame), ""]
    if tuned:
        parts += [f"## {TUNED}", "", tuned[0], "", tuned[1].to_markdown(index=False, disable_numparse=True), ""]
    if figure_names:
        parts += [f"## {FIGURES}", ""] + [f"![{name}](figures/{name})" for name in figure_names] + [""]
    parts += [f"## {METHODS}", ""] + [f"- {line}" for line in method_lines] + [""]
    return "\n".join(parts)


def build_report(storage: str, study: str | None, out: str | Path, wandb: str = "off",
                 bootstrap: int = 1000, runs_dir: str | Path | None = None) -> list[Path]:
    """Write the report files into `out` and return their paths. Everything comes from the
    database, except the A group's attention figure, drawn from the runs' `attention.npz` where
    `runs_dir` holds their run directories."""
    if bootstrap < 0:
        raise UserError(f"--bootstrap must be 0 or more, got {bootstrap}")
    check_writable_dir(out, "the report")
    refuse_foreign(Path(out), "report")  # a folder of the user's own is never written into
    data = load_table3(storage, study)
    if data.runs.empty:
        raise UserError(f"study {data.study!r} has no complete runs yet: nothing to report")
    check_bootstrap_budget(data, bootstrap)  # a count the user gives: against its budget, before allocating
    if gap := missing_base(data):  # the rows there are can still be read
        print(f"ablate: warning: {gap}", file=sys.stderr, flush=True)
    out = Path(out)
    draws = sentence_draws(data, bootstrap) if bootstrap else {}
    frame = table3_frame(data, draws)
    title = f"{'Table 3 ablation' if has_paper(frame) else 'Ablation table'} at {data.preset} scale: {data.study}"
    cap = caption(data, frame)
    tuned, clause = None, None
    if data.tuned is not None and not data.tuned.runs.empty:
        best = table3_frame(data.tuned, sentence_draws(data.tuned, bootstrap) if bootstrap else {})
        tuned = (tuning.selection(data) + ".", tuning.tuning_frame(data, frame, best))
        clause = tuning.headline_clause(tuned[1], list(data.tuning.get("values", {})))
    said, caveat_lines = summary(frame, clause), caveats(data, frame)
    summary_lines = [line for _, line in said]
    method_lines = methods(data, frame, bootstrap, draws) + ([f"{line}."] if tuned and (line := tuning.cost(data)) else [])
    pictures = {**figs.render_all(frame, data.curves), **(tuning.render(data) if tuned else {}),
                **group_attention_pictures(data.runs, runs_dir)}

    files: dict[str, str | bytes] = {f"figures/{name}": png for name, png in pictures.items()}
    files["table3.csv"] = frame.to_csv(float_format="%.6g")
    if tuned:
        files["tuning.csv"] = tuned[1].to_csv(index=False)
    files["table3.md"] = markdown_report(title, cap, frame, summary_lines, method_lines, list(pictures), caveat_lines,
                                         tuned)
    files["table3.tex"] = to_latex(frame, cap.replace("±", r"$\pm$"))
    files["report.html"] = render(title, cap, display_frame(frame), pictures, summary=summary_lines,
                                  methods=method_lines, caveats=caveat_lines, tuned=tuned)
    written = write_whole(out, files)
    if wandb != "off":
        log_to_wandb(data, frame, out, wandb, list(pictures), caveat_lines, said)
    return written


def write_whole(out: Path, files: dict[str, str | bytes]) -> list[Path]:
    """Write the report's `files` ({name under out: content}) all or none: each is written into a
    staging folder of ours inside `out` first, then every one renamed into place (renames need no
    space). A disk that fills up while staging is one line (exit status 1) and leaves no partial
    report: the staging folder goes, and so does `out` itself when this call created it."""
    created = first_missing(out)
    stage: Path | None = None
    try:
        with disk_full_ends_the_run(out):
            out.mkdir(parents=True, exist_ok=True)
            mark(out, "report")
            stage = Path(tempfile.mkdtemp(prefix=".ablate-report-", suffix=".tmp", dir=out))
            for name, content in files.items():
                staged = inside(stage, *name.split("/"))  # a figure's name holds a group's
                staged.parent.mkdir(parents=True, exist_ok=True)
                staged.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
            written = []
            for name in files:
                path = not_a_link(inside(out, *name.split("/")))
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(inside(stage, *name.split("/")), path)
                written.append(path)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        if stage is not None and stage.is_dir():
            shutil.rmtree(stage, ignore_errors=True)
    return written


WANDB_INIT_TIMEOUT_S = 30.0  # W&B's own init_timeout is 90 s


def log_to_wandb(data: Table3Data, frame: pd.DataFrame, out: Path, setting: str,
                 figure_names: Sequence[str], caveat_lines: Sequence[str],
                 said: Sequence[tuple[str, str]] | None = None) -> None:
    """The report in one W&B run of the project: the numeric table as a `wandb.Table`, every
    figure (learning curves per group too) as an image, report.html itself, and the lines the
    report opens with (caveats, then what the table says) as the run's notes and as a table of lines."""
    from lightning_modules.run.preflight import wandb_mode

    mode = wandb_mode(setting)
    if mode is None:
        return
    import wandb

    lines = [("caveat", line) for line in caveat_lines] + list(summary(frame) if said is None else said)  # its opening
    run = None
    for attempt in (mode, "offline") if mode == "online" else (mode,):
        try:  # online within W&B's init_timeout (it had retried for 109 s), else offline in the report's folder
            settings = (wandb.Settings(init_timeout=WANDB_INIT_TIMEOUT_S)
                        if attempt == "online" and not os.environ.get("WANDB_INIT_TIMEOUT") else None)
            run = wandb.init(project="transformer-ablations", name=f"report-{data.study}", job_type="report",
                             group=data.study, mode=attempt, dir=str(out), reinit="finish_previous",
                             notes="\n".join(text for _, text in lines) or None, settings=settings,
                             config={"study": data.study, "preset": data.preset, "overrides": data.overrides})
            break
        except Exception as err:  # noqa: BLE001 (the report is written: W&B is an extra)
            then = "logging offline instead" if attempt == "online" else "the report is written without it"
            print(f"ablate: warning: W&B {attempt} could not start ({' '.join(str(err).split())[:160]}); {then}",
                  file=sys.stderr, flush=True)
    if run is None:
        return
    try:
        run.log({"table3": wandb.Table(dataframe=frame.reset_index()),
                 "notes": wandb.Table(columns=["kind", "text"], data=[list(line) for line in lines]),
                 "report": wandb.Html((out / "report.html").read_text(encoding="utf-8"), inject=False),
                 **{f"figures/{name[:-4]}": wandb.Image(str(out / "figures" / name)) for name in figure_names}})
    finally:
        run.finish()
