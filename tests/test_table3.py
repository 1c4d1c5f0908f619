"""`ablate table3` and `ablate report`: real runs on the Ding corpus, a real SQLite study, real
sacreBLEU bootstrap, matplotlib figures, the HTML report in headless Chromium, W&B offline.

Tiny models and 10 steps: these check the machinery (queueing, resuming, never repeating, the
report from the database alone), not the ablations' outcome.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState

from lightning_modules.convergence import classify_stored
from foundation.errors import UserError
from ablations.spec import load_spec
from tables.plan import Table3Plan, make_plan, parse_seeds, queue, select_rows
from conftest import start_chromium
from here import ablate_here
from test_sweeps import wait_for_running_trial, watch

SMALL = ["--max-steps", "10", "--no-wandb", "d_model=32", "d_ff=64", "n_heads=4", "n_layers=1",
         "data.vocab_size=500", "data.valid_size=100", "data.test_size=100", "data.max_tokens=2000",
         "eval.max_len_offset=10", "train.progress_bar=false", "train.val_check_interval=5",
         "train.checkpoint_every=5"]
ROWS = ["base", "D1", "E"]
REPORT_FILES = ["table3.md", "table3.csv", "table3.tex", "report.html", "figures/bleu_vs_params.png",
                "figures/ppl_vs_time.png", "figures/change_vs_base.png", "figures/curves_D.png",
                "figures/curves_E.png", "figures/verdicts_D.png", "figures/verdicts_E.png"]


def ablate(*args: str, env: dict[str, str] | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def table3_args(tmp: Path, *extra: str) -> list[str]:
    return ["table3", "--preset", "tiny", "--storage", f"sqlite:///{tmp}/t3.db", "--runs-dir",
            str(tmp / "runs"), *SMALL, *extra]


def trials(tmp: Path, study: str = "table3-tiny") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{tmp}/t3.db").get_trials()


# --- row and seed selection -----------------------------------------------------------------

def test_rows_expand_groups_keep_spec_order_and_always_include_base():
    spec = load_spec()
    assert select_rows("D3,A", spec, None) == ["base", "A1", "A2", "A3", "A4", "D3"]
    assert select_rows(None, spec, ["E"]) == ["base", "E"]
    assert select_rows(None, spec, None) == list(spec) and len(spec) == 20
    with pytest.raises(UserError, match="did you mean 'C3'"):
        select_rows("base,C33", spec, None)


@pytest.mark.parametrize("text", ["1,x", "", "2,2"])
def test_bad_seeds_are_refused(text):
    with pytest.raises(UserError, match="--seeds"):
        parse_seeds(text, [1])


def test_seeds_default_to_the_presets_and_the_command_line_overrides_them(tmp_path):
    storage, runs = f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs")
    assert make_plan("cpu", storage, runs, []).seeds == [1, 2, 3]  # cpu.yaml: table3.seeds
    assert make_plan("demo", storage, runs, []).seeds == [1]  # no table3.seeds: train.seed
    assert make_plan("demo", storage, runs, ["train.seed=7"]).seeds == [7]
    assert make_plan("cpu", storage, runs, [], seeds="4,5").seeds == [4, 5]


def test_one_seed_rule_gives_rows_far_from_base_in_the_paper_their_first_seed_only(tmp_path):
    storage, runs = f"sqlite:///{tmp_path}/t.db", str(tmp_path / "runs")
    plan = make_plan("cpu", storage, runs, [], rows="base,A1,C1,D4", seeds="4,5")
    # paper PPL: base 4.92; A1 5.29 (7.5% off: all seeds), C1 6.11 and D4 5.47 (>= 10%: one seed)
    assert plan.one_seed_rows == ["C1", "D4"]
    assert plan.runs() == [("base", 4), ("base", 5), ("A1", 4), ("A1", 5), ("C1", 4), ("D4", 4)]
    assert plan.describe_seeds() == "2 seeds (1 for C1, D4)"
    every = make_plan("cpu", storage, runs, [], rows="base,C1", every_seed=True)
    assert every.runs() == [("base", 1), ("base", 2), ("base", 3), ("C1", 1), ("C1", 2), ("C1", 3)]
    assert make_plan("demo", storage, runs, [], rows="C1").one_seed_rows == []  # demo states no rule
    study, queued = queue(replace(plan, preset="tiny", overrides=["train.max_steps=1"]))
    assert queued == 6 and sorted((t.user_attrs["row"], t.user_attrs["seed"]) for t in study.trials) \
        == sorted(plan.runs())


def test_unknown_row_is_a_one_line_error_and_nothing_is_written(tmp_path, capfd):
    result = ablate_here(capfd, *table3_args(tmp_path, "--rows", "base,Q9"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "unknown Table 3 row or group 'Q9'" in lines[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "t3.db").exists()


def test_a_study_keeps_its_settings(tmp_path):
    plan = Table3Plan(study="t", storage=f"sqlite:///{tmp_path}/t3.db", preset="tiny", rows=["base"],
                      seeds=[1], runs_dir=str(tmp_path / "runs"), overrides=["train.max_steps=10"])
    study, queued = queue(plan)
    assert queued == 1 and queue(plan)[1] == 0  # already queued: not again
    assert study.user_attrs["kind"] == "table3" and study.user_attrs["setup"]["scale"]["width"] == 0.25
    with pytest.raises(UserError, match=r"differs in its overrides \(train.max_steps: 10 -> 20; there -> here\)"):
        queue(replace(plan, overrides=["train.max_steps=20"]))


def test_a_study_is_the_same_table_whatever_the_overrides_order_or_where_output_goes(tmp_path):
    """Overrides are compared as the settings they make: their order, a flat key for its dotted
    one, and W&B or the progress bar (where output goes, not what is computed) do not make
    another table; a changed value does, and so does a model key."""
    plan = Table3Plan(study="t", storage=f"sqlite:///{tmp_path}/t3.db", preset="tiny", rows=["base"],
                      seeds=[1], runs_dir=str(tmp_path / "runs"),
                      overrides=["train.max_steps=10", "d_model=32", "train.wandb=off"])
    assert queue(plan)[1] == 1
    for same in (["model.d_model=32", "train.max_steps=10"],  # no --no-wandb this sitting
                 ["d_model=32", "train.max_steps=10", "train.wandb=offline", "train.progress_bar=true"],
                 ["train.max_steps=7", "d_model=32", "train.max_steps=10"]):  # the later wins
        assert queue(replace(plan, overrides=same))[1] == 0, same
    with pytest.raises(UserError, match=r"differs in its overrides \(model.d_model: 32 -> 48; there -> here\)"):
        queue(replace(plan, overrides=["d_model=48", "train.max_steps=10"]))


def test_where_a_corpus_is_kept_is_no_part_of_a_table_but_its_text_is(tmp_path):
    """Two machines of one study may keep the same corpus in different places (#70: --data-dir or a
    file's path made "another table"): the table compares the text the runs read (its digest, from
    the data check before anything is queued), not where it was read from."""
    from tables.plan import check_data
    from test_data import synthetic_pairs, write_lines

    src, tgt = synthetic_pairs(600)

    def kept_in(folder: Path, targets: list[str]) -> list[str]:
        folder.mkdir()
        settings = ["data.corpus=files"]
        for split, (a, b) in {"train": (0, 500), "valid": (500, 550), "test": (550, 600)}.items():
            settings += [f"data.{split}_src={write_lines(folder / f'{split}.en', src[a:b])}",
                         f"data.{split}_tgt={write_lines(folder / f'{split}.de', targets[a:b])}"]
        return settings

    small = ["train.max_steps=10", "d_model=32", "d_ff=64", "n_heads=4", "n_layers=1", "data.vocab_size=200",
             "data.max_tokens=300", f"data.cache_dir={tmp_path / 'cache'}"]
    plan = Table3Plan(study="t", storage=f"sqlite:///{tmp_path}/t3.db", preset="tiny", rows=["base"], seeds=[1],
                      runs_dir=str(tmp_path / "runs"), overrides=small + kept_in(tmp_path / "here", tgt))
    assert queue(plan, corpus=check_data(plan))[1] == 1
    elsewhere = replace(plan, overrides=small + kept_in(tmp_path / "there", tgt) + ["data.data_dir=/mnt/wmt14",
                                                                                      "data.base_url=http://mirror"])
    assert queue(elsewhere, corpus=check_data(elsewhere))[1] == 0  # the same table: nothing queued again
    edited = replace(plan, overrides=small + kept_in(tmp_path / "edited", [t + " ." for t in tgt]))
    with pytest.raises(UserError, match=r"study 't' is a Table 3 trained on other text under the same corpus "
                                        r"settings .* for base\)"):
        queue(edited, corpus=check_data(edited))


def test_a_study_refuses_an_edited_config_or_preset_file_and_names_it(tmp_path):
    """Editing the settings between sittings would train the rows still queued differently: the
    table refuses and names what changed and the file that sets it (the --config file, the preset's
    file). Output-only settings in the file do not make another table."""
    from tables.plan import identity, table_difference

    config = tmp_path / "recipe.yaml"
    config.write_text("train: {warmup_steps: 5, max_steps: 10}\n")
    plan = Table3Plan(study="t", storage=f"sqlite:///{tmp_path}/t3.db", preset="tiny", rows=["base"],
                      seeds=[1], runs_dir=str(tmp_path / "runs"), overrides=[], config=str(config))
    study, _ = queue(plan)
    assert study.user_attrs["runs"]["base-s1"]["train"]["warmup_steps"] == 5
    config.write_text("train: {warmup_steps: 7, max_steps: 10}\n")  # each sitting makes its plan afresh
    with pytest.raises(UserError, match=rf"differs in its configuration from the --config file {config} "
                                        r"\(train.warmup_steps: 5 -> 7; there -> here\)"):
        queue(replace(plan))
    config.write_text("train: {warmup_steps: 5, max_steps: 10, log_every_n_steps: 3}\n")  # output only
    assert queue(replace(plan))[1] == 0

    plan = replace(plan, config=None)
    edited = identity(plan)  # as if the preset's file had said warmup_steps 300 and says 400 now
    edited["base-s1"]["train"]["warmup_steps"] = 300
    assert table_difference({"runs": edited}, plan, identity(plan)) == \
        ("configuration from the preset's file ablations/presets/tiny.yaml",
         "train.warmup_steps: 300 -> 400; there -> here")


def test_identity_leaves_out_exactly_the_fields_marked_not_trained():
    """Every field of the run's configuration, this version's and any added later: changing one
    marked output-only, location (where input is read from) or recipe (the preset's scale rule,
    whose results are fields of their own) leaves a run's identity as it was;
    changing any other changes it (the
    tokenizer's model keys excepted: `requested_config` leaves them to the tokenizer). A field a
    stored identity lacks (one added to the config since) reads as its default."""
    from dataclasses import fields, is_dataclass

    from lightning_modules.config import TOKENIZER_KEYS, RunConfig, computed_config
    from tables.plan import identity, table_difference

    def other(value):  # a different value of the same kind
        if isinstance(value, bool) or value is None:
            return not value
        return value + (1 if isinstance(value, int) else 0.5 if isinstance(value, float) else "-changed")

    plan = Table3Plan(study="t", storage="sqlite:///unused.db", preset="tiny", rows=["base"], seeds=[1],
                      runs_dir="runs", overrides=[])
    wanted, resolved, defaults = identity(plan), plan.config_of("base", 1), computed_config(RunConfig())
    assert wanted["base-s1"] == computed_config(resolved)
    keys = [(f, None) for f in fields(resolved) if not is_dataclass(getattr(resolved, f.name))]
    keys += [(f, part.name) for part in fields(resolved) if is_dataclass(getattr(resolved, part.name))
             for f in fields(getattr(resolved, part.name)) if not (part.name == "model" and f.name in TOKENIZER_KEYS)]
    marked = []
    for f, part in keys:
        cfg = plan.config_of("base", 1)
        owner = cfg if part is None else getattr(cfg, part)
        setattr(owner, f.name, other(getattr(owner, f.name)))
        section = next((s for s in fields(cfg) if s.name == part), None)  # a whole section may be marked
        output_only = bool(f.metadata.get("not_trained") or section is not None and section.metadata.get("not_trained"))
        assert (computed_config(cfg) == wanted["base-s1"]) == output_only, (part, f.name)
        marked += [f"{part}.{f.name}"] * output_only
        if part is not None and not output_only:  # stored before the field was added
            lacking = {key: value for key, value in wanted["base-s1"][part].items() if key != f.name}
            stored = {"runs": {"base-s1": {**wanted["base-s1"], part: lacking}}}
            same = table_difference(stored, plan, wanted) is None
            assert same == (wanted["base-s1"][part][f.name] == defaults[part][f.name]), (part, f.name)
    assert len(keys) > 60 and {"train.wandb", "train.progress_bar", "train.wandb_group", "data.data_dir",
                               "data.base_url", "data.cache_dir", "data.train_src", "scale.steps"} <= set(marked)
    assert not {"train.seed", "train.max_steps", "model.d_model", "data.corpus"} & set(marked)


# --- the table end to end -----------------------------------------------------------------

@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    """base, D1 and E with two seeds each, 2 workers, report at the end. `ablate table3` runs in
    this process (its two workers, and each run's trial, in processes of their own): its exit
    status, and the lines it printed itself."""
    from ablate.cli import main

    tmp = tmp_path_factory.mktemp("table3")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(table3_args(tmp, "--rows", ",".join(ROWS), "--seeds", "1,2", "--workers", "2"))
    assert code == 0, err.getvalue()[-3000:]
    assert "6 queued now" in out.getvalue()
    return tmp


def test_every_row_and_seed_is_complete_in_its_own_directory(table: Path):
    done = [t for t in trials(table) if t.state == TrialState.COMPLETE]
    assert sorted((t.user_attrs["row"], t.user_attrs["seed"]) for t in done) == \
        sorted((r, s) for r in ROWS for s in (1, 2))
    for t in done:
        assert t.user_attrs["run_dir"] == f"table3-tiny/{t.user_attrs['row']}-s{t.user_attrs['seed']}"
        run_dir = table / "runs" / t.user_attrs["run_dir"]  # relative to --runs-dir
        results = json.loads((run_dir / "results.json").read_text())
        assert results["row"] == t.user_attrs["row"] and results["seed"] == t.user_attrs["seed"]
        assert t.user_attrs["ppl"] == results["ppl"] and t.user_attrs["bleu"] == results["bleu"]
        # W&B groups a table's runs by row (its seeds are the group's runs)
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["train"]["wandb_group"] == f"table3-tiny/{t.user_attrs['row']}"
    learned = [t for t in done if t.user_attrs["row"] == "E"]
    assert all(t.user_attrs["model"]["positional"] == "learned" for t in learned)
    assert all(t.user_attrs["model"]["dropout"] == 0.0 for t in done if t.user_attrs["row"] == "D1")


def test_report_has_every_row_beside_the_paper(table: Path):
    report = table / "runs" / "table3-tiny" / "report"
    for name in REPORT_FILES:
        assert (report / name).is_file(), name
    frame = pd.read_csv(report / "table3.csv", index_col="row")
    assert list(frame.index) == ROWS and (frame["seeds"] == 2).all()
    assert frame.loc["D1", "paper_ppl"] == 5.77 and frame.loc["base", "paper_bleu"] == 25.8
    assert frame.loc["E", "positional"] == "learned" and frame.loc["D1", "P_drop"] == 0.0
    done = [t for t in trials(table) if t.state == TrialState.COMPLETE and t.user_attrs["row"] == "E"]
    assert frame.loc["E", "ppl"] == pytest.approx(sum(t.user_attrs["ppl"] for t in done) / 2)
    # the CSV prints 6 significant digits (%.6g): each of the three values is off by half a unit
    # in its last printed digit at most (PPL in the hundreds keeps 3 decimals, their difference 4)
    printed = [frame.loc["E", "ppl"], frame.loc["base", "ppl"], frame.loc["E", "d_ppl"]]
    rounding = sum(0.5 * 10 ** (math.floor(math.log10(abs(x))) - 5) for x in printed)
    assert frame.loc["E", "d_ppl"] == pytest.approx(frame.loc["E", "ppl"] - frame.loc["base", "ppl"], abs=rounding)
    # one test for PPL and BLEU: BLEU's interval adds the dev sentences' variance to the seeds'
    assert pd.isna(frame.loc["base", "bleu_beyond_noise"]) and frame.loc["E", "bleu_sentence_se"] > 0
    for row in ("D1", "E"):
        low, high = frame.loc[row, "d_bleu_low"], frame.loc[row, "d_bleu_high"]
        assert low < frame.loc[row, "d_bleu"] < high
        assert frame.loc[row, "bleu_beyond_noise"] == (low > 0 or high < 0)
    md = (report / "table3.md").read_text()
    for row in ROWS:
        assert f"| {row} " in md
    assert "- **Spearman rank correlation with the paper's**: dev PPL" in md and "±" in md and "| E " in md
    assert "sentence level is not measured" not in md  # every run kept its dev translations
    assert md.split("## What this table says\n\n- ")[1].startswith("Beyond noise, ")
    assert " of the 2 rows differ from base in dev PPL (" in md.split("## What this table says")[1].split("\n")[2]
    assert "## Methods\n\n- Beyond noise, for dev PPL and dev BLEU alike, means" in md
    # seeds as noise: the difference to base with its interval (two seeds, paired by seed)
    assert frame.loc["E", "d_ppl_low"] < frame.loc["E", "d_ppl"] < frame.loc["E", "d_ppl_high"]
    assert frame.loc["E", "ci_method"] == "paired"
    assert frame.loc["E", "beyond_noise"] == (frame.loc["E", "d_ppl_low"] > 0 or frame.loc["E", "d_ppl_high"] < 0)
    # 10 steps: nothing has converged, and the report says so with the rule
    assert set(frame["convergence"]) <= {"still improving", "unknown", "diverged", "unstable"} and \
        frame["convergence"].notna().all()
    assert "Convergence rule: converged = dev PPL improved by less than 1%" in md
    assert "stored none of the convergence rule's inputs" not in md  # every run stored them
    assert "- **D, regularisation" in md and "- **E, learned" in md
    assert "\\begin{tabular}" in (report / "table3.tex").read_text()
    for name in REPORT_FILES:
        if name.endswith(".png"):
            assert (report / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_modifications_table_runs_beside_table_3_and_reports_without_the_paper(table: Path, tmp_path: Path,
                                                                                     capfd):
    """Issue #41's command at tiny scale, in a storage that already holds a Table 3 (as after `make
    demo`): the spec gets its own study, `modifications-tiny`, and a report with no paper column,
    no sign comparison and no rank correlation, with the verdicts of its groups. One row besides
    base shows each: a Table 3 of any size has the paper's columns and the rank correlation's line;
    its group gets the spec's verdict, and a group with no row in the table gets none. It is also
    a smoke table (#70): its runs end at step 3, before their second dev evaluation, as a first
    check on a GPU does, and its report is still written (the verdict figure had raised IndexError)."""
    shutil.copy(table / "t3.db", tmp_path / "t3.db")
    rows = ["base", "pre_ln"]
    result = ablate_here(capfd, *table3_args(tmp_path, "--spec", "ablations/modifications.yaml",
                                             "--rows", ",".join(rows), "--seeds", "1", "--max-steps", "3"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert {s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{tmp_path}/t3.db")} == \
        {"table3-tiny", "modifications-tiny"}
    assert len(trials(tmp_path)) == len(trials(table))  # Table 3's study untouched
    report = tmp_path / "runs" / "modifications-tiny" / "report"
    frame = pd.read_csv(report / "table3.csv", index_col="row")
    assert list(frame.index) == rows and frame["paper_ppl"].isna().all()
    md = (report / "table3.md").read_text()
    assert md.startswith("# Ablation table at tiny scale: modifications-tiny")
    assert "(paper" not in md and "sign = paper" not in md and "Spearman" not in md
    assert "- **normalisation, pre-LN" in md
    assert "- **feed-forward" not in md and "- **positions" not in md  # no row of those groups here
    assert "| pre_ln " in md and "norm_position pre" in md
    assert (report / "figures" / "verdicts_normalisation.png").is_file()
    assert all(len(t.intermediate_values) <= 1 for t in trials(tmp_path, "modifications-tiny"))


def test_rerun_repeats_nothing(table: Path, capfd):
    """The same command again queues nothing and starts no worker. (--no-report: the report of a
    sitting with nothing left to run is test_a_table_made_from_python_writes_its_report_when_asked's.)"""
    before = [(t.number, t.state) for t in trials(table)]
    result = ablate_here(capfd, *table3_args(table, "--rows", ",".join(ROWS), "--seeds", "1,2", "--workers", "2",
                                             "--no-report"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "0 queued now" in result.stdout and "worker" not in result.stdout
    assert [(t.number, t.state) for t in trials(table)] == before


def test_report_is_regenerated_identically_from_the_database_alone(table: Path, tmp_path: Path, capfd):
    report = table / "runs" / "table3-tiny" / "report"
    saved = tmp_path / "runs-moved"
    shutil.move(table / "runs", saved)  # no run directory left: the database only
    try:
        result = ablate_here(capfd, "report", "--storage", f"sqlite:///{table}/t3.db", "--out", str(tmp_path / "again"))
        assert result.returncode == 0, result.stderr[-2000:]
    finally:
        shutil.move(saved, table / "runs")
    for name in REPORT_FILES:
        assert (tmp_path / "again" / name).read_bytes() == (report / name).read_bytes(), name


def test_a_table_made_from_python_writes_its_report_when_asked(table: Path, tmp_path: Path):
    """`tables.make.make_table3`, the library entry point `ablate table3` calls: the same table
    from Python (nothing left to run) writes the same report where asked, and none when not."""
    from tables.make import make_table3

    overrides = [item for item in SMALL if "=" in item] + ["train.max_steps=10", "train.wandb=off"]
    plan = make_plan("tiny", f"sqlite:///{table}/t3.db", str(table / "runs"), overrides, rows=",".join(ROWS),
                     seeds="1,2")
    before = [(t.number, t.state) for t in trials(table)]
    assert make_table3(plan, report=False).report == []
    outcome = make_table3(plan, report_dir=tmp_path / "report")
    assert outcome.exit_status == 0 and [(t.number, t.state) for t in trials(table)] == before
    written = {str(path.relative_to(tmp_path / "report")) for path in outcome.report}
    assert set(REPORT_FILES) <= written
    for name in REPORT_FILES:
        assert (tmp_path / "report" / name).read_bytes() == (table / "runs" / "table3-tiny" / "report" / name).read_bytes()


def test_a_table_made_from_python_checks_its_data_before_anything_is_queued(tmp_path: Path, capsys):
    """A length limit that leaves no training pairs: from Python as from `ablate table3`, the
    same one line before any study or report folder is made."""
    from ablate.cli import main
    from tables.make import make_table3
    from test_bad_input import LETTERS, corpus

    files = corpus(tmp_path)
    settings = ["data.max_train_len=1", "train.max_steps=2", "data.valid_size=50", "data.test_size=50", *LETTERS]
    storage, runs = f"sqlite:///{tmp_path}/t3.db", str(tmp_path / "runs")
    assert main(["table3", "--storage", storage, "--runs-dir", runs, "--rows", "base", "--no-wandb", *files,
                 *settings]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    paths = dict(zip(files[::2], files[1::2]))
    overrides = [*settings, "data.corpus=files", "train.wandb=off",
                 *(f"data.{split}_{side}={paths[f'--{split}-{side}']}" for split in ("train", "valid")
                   for side in ("src", "tgt"))]
    plan = make_plan("tiny", storage, runs, overrides, rows="base")
    with pytest.raises(UserError) as refused:
        make_table3(plan)
    assert f"ablate: error: {refused.value}" == line and "no training pairs left" in line
    assert not (tmp_path / "t3.db").exists() and not (Path(runs) / "table3-tiny" / "report").exists()


def test_the_report_classifies_each_run_from_its_stored_inputs_not_its_stored_class(table: Path, tmp_path: Path,
                                                                                   capfd):
    """The class a run recorded is its own word at the time; the report decides the class again, by
    the rule as it is now, from the inputs the run stored (dev-PPL curve, window-mean training
    losses, warmup, unigram PPL), with no run directory needed. A run that stored no inputs (one
    trained before runs kept them) is left unclassified, and the report says so.

    One report of both: a D1 run stored again with a stale class, an E run stored again without its
    inputs (each the newest complete trial of its row and seed: the one the report uses)."""
    shutil.copy(table / "t3.db", tmp_path / "t3.db")
    storage = f"sqlite:///{tmp_path}/t3.db"
    study = optuna.load_study(study_name="table3-tiny", storage=storage)

    def newest(row: str) -> optuna.trial.FrozenTrial:
        return max((t for t in study.get_trials() if t.state == TrialState.COMPLETE and t.user_attrs["row"] == row),
                   key=lambda t: t.number)

    d1, e = newest("D1"), newest("E")
    now, then = d1.user_attrs["convergence"], "diverged"  # the worst class: the row's cell would show it
    assert now != then and classify_stored(d1.user_attrs).label == now
    original = pd.read_csv(table / "runs" / "table3-tiny" / "report" / "table3.csv", index_col="row")

    def add(like: optuna.trial.FrozenTrial, attrs: dict) -> None:
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=like.value, params=like.params,
                                                  distributions=like.distributions, user_attrs=attrs))

    add(d1, {**d1.user_attrs, "convergence": then, "convergence_reason": "a class another rule gave"})
    add(e, {key: value for key, value in e.user_attrs.items() if key != "train_loss_curve"})  # no inputs
    moved = tmp_path / "runs-moved"
    shutil.move(table / "runs", moved)  # the database alone
    try:
        result = ablate_here(capfd, "report", "--storage", storage, "--out", str(tmp_path / "r"), "--bootstrap", "0")
    finally:
        shutil.move(moved, table / "runs")
    assert result.returncode == 0, result.stderr[-2000:]
    md, frame = (tmp_path / "r" / "table3.md").read_text(), pd.read_csv(tmp_path / "r" / "table3.csv", index_col="row")
    assert frame.loc["D1", "convergence"] == original.loc["D1", "convergence"]  # the stale class: not read
    assert "a class another rule gave" not in md
    # the stale run is not one without inputs: only E's is counted
    assert (f"1 of the {int(original['seeds'].sum())} runs stored none of the convergence rule's inputs "
            f"(trained before runs kept them), so their class is left blank") in md
    others = [t.user_attrs["convergence"] for t in study.get_trials()
              if t.state == TrialState.COMPLETE and t.user_attrs["row"] == "E"
              and t.user_attrs["seed"] != e.user_attrs["seed"]]
    assert int(original.loc["E", "seeds"]) == 2
    assert frame.loc["E", "convergence"] == others[-1]  # the other seed's class alone


def test_report_logs_table_figures_verdicts_and_page_to_wandb_offline(table: Path, tmp_path: Path, capfd):
    out = tmp_path / "wb"
    result = ablate_here(capfd, "report", "--storage", f"sqlite:///{table}/t3.db", "--study", "table3-tiny",
                         "--out", str(out), "--wandb-report", "offline", "--bootstrap", "0")
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = list((out / "wandb").glob("offline-run-*"))
    tables = list(run.rglob("table3_*.table.json"))
    images = sorted(p.name.rsplit("_", 2)[0] for p in run.rglob("*.png"))
    figures = sorted(p.stem for p in (out / "figures").glob("*.png"))
    assert tables and images == figures and "curves_D" in figures  # the learning curves too
    data = json.loads(tables[0].read_text())
    assert "row" in data["columns"] and {r[data["columns"].index("row")] for r in data["data"]} == set(ROWS)
    # what the report opens with (caveats, where a table has any, then what the table says) as
    # lines, in the order of the markdown report
    (notes,) = run.rglob("notes_*.table.json")
    lines = json.loads(notes.read_text())["data"]
    md = (out / "table3.md").read_text()
    assert [kind for kind, _ in lines] == ["headline", "verdict D", "verdict E", "rank correlation"]
    opening = md.split("## What this table says\n\n")[1].split("\n\n")[0].splitlines()
    assert opening[0] == f"- {lines[0][1]}" and lines[0][1].startswith("Beyond noise, ")
    assert opening[1:] == [f"- **{text.replace(': ', '**: ', 1)}" for _, text in lines[1:]]
    (page,) = run.rglob("report_*.html")  # the whole report, figures inline
    assert page.read_text(encoding="utf-8") == (out / "report.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """conftest's Chromium (`start_chromium`), started once for this module's pages (a start costs
    about 2 CPU seconds)."""
    with start_chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


@pytest.fixture
def browser(chromium) -> object:
    """The module's Chromium, its window back at the size it starts with (a test before may have set
    another); each test loads its own page."""
    chromium.set_window_size(1400, 1000)
    return chromium


def test_report_html_renders_in_chromium(table: Path, browser, tmp_path: Path):
    from selenium.webdriver.common.by import By

    page = table / "runs" / "table3-tiny" / "report" / "report.html"
    browser.get(page.as_uri())
    cells = [r.find_elements(By.TAG_NAME, "td") for r in browser.find_elements(By.CSS_SELECTOR, "#table3 tbody tr")]
    assert [c[0].text for c in cells] == ROWS
    headers = [h.get_attribute("textContent") for h in browser.find_elements(By.CSS_SELECTOR, "#table3 thead th")]
    assert {"PPL (paper)", "BLEU (paper)", "ΔBLEU [95% CI]", "BLEU beyond noise", "ΔPPL [95% CI] (paper)",
            "PPL beyond noise", "sign = paper", "converged", "changes from base"} <= set(headers)
    by_header = {h: i for i, h in enumerate(headers)}
    changes = [c[by_header["changes from base"]].text for c in cells]
    assert changes == ["the paper's base", "P_drop 0.0", "pos learned"]  # only what a row changes
    assert cells[1][by_header["PPL (paper)"]].text.endswith("(5.77)")
    classes = [c[by_header["converged"]] for c in cells]  # coloured by class (the colours: the test below)
    assert all(c.get_attribute("class") == c.text.split(" (")[0].replace(" ", "-") for c in classes if c.text)
    table_width = browser.execute_script("return document.getElementById('table3').scrollWidth")
    assert table_width <= 1400, f"the table needs {table_width} px"  # a normal window
    images = browser.find_elements(By.TAG_NAME, "img")
    # three summary figures, and per group (D, E) its learning curves and its verdict over training
    assert len(images) == 7
    assert all(browser.execute_script("return arguments[0].naturalWidth", img) > 100 for img in images)
    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_report_html_colours_the_convergence_class_cells(browser, tmp_path: Path):
    """Each class has its colour (unstable and diverged share one); a cell of several seeds is coloured
    by its worst class; other columns and an empty class cell are left plain."""
    from selenium.webdriver.common.by import By

    from reports.html import render

    classes = ["converged", "still improving", "overfitting", "unstable (1/3)", "diverged", "unknown", ""]
    table = pd.DataFrame({"row": [f"r{i}" for i in range(len(classes))], "converged": classes,
                          "PPL (paper)": ["4.92"] * len(classes)})
    page = tmp_path / "report.html"
    page.write_text(render("t", "c", table, {}))
    browser.get(page.as_uri())
    colour = "return getComputedStyle(arguments[0]).backgroundColor"
    rows = [r.find_elements(By.TAG_NAME, "td") for r in browser.find_elements(By.CSS_SELECTOR, "#table3 tbody tr")]
    assert [r[1].text for r in rows] == classes
    cell = [browser.execute_script(colour, r[1]) for r in rows]
    plain = browser.execute_script(colour, rows[0][2])
    assert plain == cell[-1] == "rgba(0, 0, 0, 0)"
    assert plain not in cell[:-1] and cell[3] == cell[4]
    assert len(set(cell[:-1])) == 5, cell  # converged, still improving, overfitting, unstable/diverged, unknown


def test_report_html_fits_a_1280_px_window_with_the_widest_rows_of_a_full_table(browser, tmp_path: Path):
    """The cpu table's widest cells (big's five changes, D1's ΔPPL, a q beside 'yes', a verdict still
    moving) in every column of the report:
    cells wrap only between their parts (the changes between items, an interval as a whole), and
    the page needs no horizontal scroll in a 1,280-px window."""
    from selenium.webdriver.common.by import By

    from reports.html import render

    rows = {
        "row": ["base", "C5", "D1", "big"],
        "changes from base": ["the paper's base", "d_model 1024, d_k 128, d_v 128", "P_drop 0.0",
                              "d_model 1024, d_ff 4096, h 16, P_drop 0.3, steps 300K"],
        "seeds": ["3", "3", "1", "1"],
        "PPL (paper)": ["24.15 ± 0.83 (4.92)", "25.47 ± 1.59 (4.66)", "125.01 (5.77)", "29.88 (4.33)"],
        "ΔPPL [95% CI] (paper)": ["+0.00 [+0.00, +0.00] (+0.00)", "+1.32 [-0.91, +3.54] (-0.26)",
                                  "+100.86 [+99.20, +102.51] (+0.85)", "+5.73 [+4.07, +7.39] (-0.59)"],
        "PPL beyond noise": ["", "no (q 0.207)", "yes (q < 0.001)", "yes (q 0.047)"],
        "PPL verdict since": ["", "15%", "99% (still moving)", "85% (late)"], "sign = paper": ["", "no", "yes", "no"],
        "converged": ["converged", "still improving (2/3)", "overfitting", "converged"],
        "BLEU (paper)": ["4.36 ± 0.62 (25.8)", "3.10 ± 1.61 (26.0)", "1.98 (24.6)", "0.50 (26.4)"],
        "ΔBLEU [95% CI]": ["+0.00 [+0.00, +0.00]", "-1.26 [-3.39, +0.87]", "-2.38 [-3.63, -1.13]",
                           "-3.86 [-5.11, -2.61]"],
        "BLEU beyond noise": ["", "no (q 0.241)", "yes (q 0.097)", "yes (q 0.047)"],
        "params ×10⁶ (paper)": ["0.48 (65)", "1.25 (168)", "0.48", "1.64 (213)"],
        "train s": ["5024", "6464", "3324", "33761"]}
    page = tmp_path / "report.html"
    page.write_text(render("t", "c", pd.DataFrame(rows), {}))
    browser.set_window_size(1280, 900)
    browser.get(page.as_uri())
    assert no_horizontal_scroll(browser) and browser.execute_script("return window.innerWidth") <= 1280
    cells = [r.find_elements(By.TAG_NAME, "td") for r in browser.find_elements(By.CSS_SELECTOR, "#table3 tbody tr")]
    d1, big = cells[2][1], cells[3][1]
    assert text_lines(browser, big) > 1 == text_lines(browser, d1)  # big's changes take several lines
    assert big.get_attribute("innerHTML") == ("d_model&nbsp;1024, d_ff&nbsp;4096, h&nbsp;16, P_drop&nbsp;0.3, "
                                              "steps&nbsp;300K")  # each change kept on one line
    # ours with its interval on one line, the paper's value on the next
    assert cells[2][4].get_attribute("innerHTML") == ('+100.86&nbsp;[+99.20,&nbsp;+102.51] '
                                                      '<span class="paper">(+0.85)</span>')
    assert text_lines(browser, cells[2][4]) == 2 and cells[2][4].text == "+100.86 [+99.20, +102.51]\n(+0.85)"
    assert cells[1][8].get_attribute("innerHTML") == "still&nbsp;improving (2/3)"


def text_lines(browser, element) -> int:
    """How many lines the text of `element` takes as laid out."""
    return browser.execute_script("const r = document.createRange(); r.selectNodeContents(arguments[0]); "
                                  "return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size", element)


def no_horizontal_scroll(browser) -> bool:
    return browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def test_report_answers_first_and_fits_a_1280_px_window(table: Path, browser):
    """The report of a real table, in Chromium at 1,280 px: what the table says (a sentence per
    group, then the rank correlation) above the table, then the figures, then the methods, collapsed;
    no horizontal scroll, with the methods closed or open. table3.md is in the same order."""
    from selenium.webdriver.common.by import By

    report = table / "runs" / "table3-tiny" / "report"
    browser.set_window_size(1280, 900)
    browser.get((report / "report.html").as_uri())
    assert browser.execute_script("return window.innerWidth") <= 1280 and no_horizontal_scroll(browser)
    said = browser.find_elements(By.CSS_SELECTOR, "#summary li")
    assert said[0].text.startswith("Beyond noise, ") and " of the 2 rows differ from base" in said[0].text  # the headline first
    assert [li.text.split(":")[0] for li in said[1:]] == [
        "D, regularisation (dropout, label smoothing)", "E, learned instead of sinusoidal positions",
        "Spearman rank correlation with the paper's"]
    assert said[1].find_element(By.TAG_NAME, "b").text == "D, regularisation (dropout, label smoothing)"
    summary, table3 = browser.find_element(By.ID, "summary"), browser.find_element(By.ID, "table3")
    figures, methods = browser.find_element(By.ID, "figures"), browser.find_element(By.ID, "methods")
    bottom = [e.location["y"] + e.size["height"] for e in (summary, table3, figures)]
    assert bottom[0] <= table3.location["y"] and bottom[1] <= figures.location["y"]
    assert bottom[2] <= methods.location["y"]  # methods last
    rule = next(li for li in methods.find_elements(By.TAG_NAME, "li") if li.get_attribute("textContent")
                .startswith("Convergence rule"))
    assert methods.get_attribute("open") is None and not rule.is_displayed()  # collapsed
    methods.find_element(By.TAG_NAME, "summary").click()
    assert methods.get_attribute("open") is not None and rule.is_displayed() and no_horizontal_scroll(browser)

    md = (report / "table3.md").read_text()
    order = ["## What this table says", "- Beyond noise, ", "- **D, regularisation", "- **E, learned", "- **Spearman rank",
             "## The table", "| row", "## Figures", "![change_vs_base.png]", "## Methods", "- Convergence rule"]
    assert [md.index(mark) for mark in order] == sorted(md.index(mark) for mark in order)


@pytest.mark.parametrize("preset", ["demo", "tiny"])
def test_a_smoke_scale_table_says_so_above_its_numbers(preset: str, browser, tmp_path: Path):
    """The demo preset's note (a smoke test, far from converged) is the first thing under the
    caption, above the table, in table3.md and in report.html as Chromium lays it out; a preset
    without a note gets nothing there."""
    from selenium.webdriver.common.by import By

    from ablate.cli import main
    from ablations.spec import load_preset
    from test_bad_input import fake_table3_study

    fake_table3_study(tmp_path / "t.db", ["base", "A1", "E"], preset=preset)
    assert main(["report", "--storage", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "r")]) == 0
    note = load_preset(preset).get("table3", {}).get("note")
    md = (tmp_path / "r" / "table3.md").read_text()
    browser.get((tmp_path / "r" / "report.html").as_uri())
    shown = browser.find_elements(By.CSS_SELECTOR, "p.caveat")
    if preset == "tiny":
        assert note is None and shown == [] and "> **" not in md
        return
    assert note.startswith("SMOKE-SCALE TABLE") and md.count(note) == 1
    assert md.index(note) < md.index("| row")
    (caveat,) = shown
    table = browser.find_element(By.ID, "table3")
    assert caveat.text == note and caveat.location["y"] + caveat.size["height"] <= table.location["y"]
    assert int(browser.execute_script("return getComputedStyle(arguments[0]).fontWeight", caveat)) >= 600


def test_report_without_a_table3_study_is_a_one_line_error(tmp_path: Path, capfd):
    optuna.create_study(study_name="sweep", storage=f"sqlite:///{tmp_path}/s.db")
    result = ablate_here(capfd, "report", "--storage", f"sqlite:///{tmp_path}/s.db", "--out", str(tmp_path / "r"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "0 Table 3 studies" in lines[0]
    assert not (tmp_path / "r").exists()


# --- killed rows are completed on re-run ----------------------------------------------------

def test_a_killed_trial_process_and_a_killed_table3_command_are_each_resumed_by_a_rerun(tmp_path: Path, capfd,
                                                                                        monkeypatch):
    """One row, the same command three times. The first sitting's trial process is SIGKILLed inside
    its run, after step 5's checkpoint: the row fails, exit status 1. The re-run resumes the row from
    that checkpoint, and is SIGKILLed itself once the resumed run has reported step 10: `ablate
    table3`, whose worker and training go with it. A re-run at once (no waiting for the heartbeat)
    sees that worker's pid gone and resumes the row again, from where it was killed, to the end.

    That last re-run is two launchers started together on the study (as on two machines sharing
    it): they share the queue, the one whose worker runs out of work waits for the other's run
    instead of reporting it as not complete, and both end with exit status 0, the row resumed once.
    (The killed command and one of the last two are processes of their own; the other sittings run
    `ablate table3` in this process, their workers and trials in processes of their own.)"""
    args = table3_args(tmp_path, "--rows", "base", "--no-report", "--max-steps", "40")  # killed at 7, then 10
    monkeypatch.setenv("ABLATE_FAULT", "train_step@7")  # SIGKILL inside the run, in the trial process
    first = ablate_here(capfd, *args)
    monkeypatch.delenv("ABLATE_FAULT")
    assert first.returncode == 1 and "not complete: base seed 1 (fail)" in first.stderr
    assert [t.state for t in trials(tmp_path)] == [TrialState.FAIL]
    proc = subprocess.Popen([sys.executable, "-m", "ablate", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        polled = watch(lambda: optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{tmp_path}/t3.db"))
        running = wait_for_running_trial(polled, lambda t: 10 in t.intermediate_values)
        assert running is not None, "the re-run never reached step 10"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert min(running.intermediate_values) == 10  # resumed at step 5: no step 5 of its own
    time.sleep(1.0)  # the worker and its training die with their parent

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "other.log", "w+") as log:
        other = subprocess.Popen([sys.executable, "-m", "ablate", *args], stdout=log, stderr=subprocess.STDOUT,
                                 text=True, env=env)
        try:
            here = ablate_here(capfd, *args)
            other.wait(timeout=600)
        finally:
            if other.poll() is None:
                other.kill()
        log.seek(0)
        outputs = [here.stdout + here.stderr, log.read()]
    assert [here.returncode, other.returncode] == [0, 0], outputs
    assert sum("waiting for base seed 1, trained by another launcher" in out for out in outputs) == 1, outputs
    states = sorted(t.state.name for t in trials(tmp_path))
    assert states == ["COMPLETE", "FAIL", "FAIL"]
    (done,) = [t for t in trials(tmp_path) if t.state == TrialState.COMPLETE]
    assert done.user_attrs["run_dir"] == running.user_attrs["run_dir"]
    assert min(done.intermediate_values) > 10  # resumed from step 10 or later, not restarted
    assert done.user_attrs["steps"] == 40
    run_dir = tmp_path / "runs" / "table3-tiny" / "base-s1"
    assert "Restoring states from the checkpoint" in (run_dir / "trial.log").read_text()
    assert json.loads((run_dir / "results.json").read_text())["steps"] == 40


def test_a_launcher_whose_worker_is_killed_sees_its_trial_fail_at_the_heartbeat_and_trains_it_again(tmp_path: Path):
    """#72: after its worker and the trial's process were SIGKILLed, the launcher waited for ever
    for "base seed 1, trained by another launcher": it watched the study without a heartbeat, so
    the dead trial never failed. With the heartbeat (2 s here) the trial fails, its retry copy is
    queued, and the launcher's next worker resumes it to the end: exit status 0."""
    from test_slurm import descendants

    args = table3_args(tmp_path, "--rows", "base", "--no-report", "--max-steps", "150", "--heartbeat", "2")
    with open(tmp_path / "launcher.log", "w+") as log:
        launcher = subprocess.Popen([sys.executable, "-m", "ablate", *args], stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            polled = watch(lambda: optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{tmp_path}/t3.db"))
            assert wait_for_running_trial(polled, lambda t: 10 in t.intermediate_values) is not None
            for pid in descendants(launcher.pid):  # its worker and the worker's trial process
                os.kill(pid, signal.SIGKILL)
            launcher.wait(timeout=300)
        finally:
            if launcher.poll() is None:
                launcher.kill()
        log.seek(0)
        output = log.read()
    assert launcher.returncode == 0, output[-3000:]
    assert "waiting for base seed 1, trained by another launcher" in output
    assert sorted(t.state.name for t in trials(tmp_path)) == ["COMPLETE", "FAIL"]
    assert json.loads((tmp_path / "runs" / "table3-tiny" / "base-s1" / "results.json").read_text())["steps"] == 150


def test_each_rows_configuration_resolved_once_is_the_runs_own():
    """The plan resolves a row once and sets each seed (`Table3Plan.config_of`): the same
    configuration as resolving the (row, seed) with its seed override on its own, for every run of
    both shipped specs."""
    from tables.plan import run_configs, seed_overrides
    from ablations.resolve import resolve

    for spec in (None, "ablations/modifications.yaml"):
        plan = Table3Plan(study="t", storage="sqlite:///unused.db", preset="cpu", rows=list(load_spec(spec)),
                          seeds=[1, 7], runs_dir="runs", overrides=["train.lr_scale=0.7"], spec_path=spec)
        configs = run_configs(plan)
        assert list(configs) == plan.runs()
        assert all(configs[row, seed] == resolve("cpu", row, None, ["train.lr_scale=0.7", *seed_overrides(seed)], spec)
                   for row, seed in plan.runs())
