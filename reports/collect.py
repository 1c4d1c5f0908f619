"""Read a Table 3 study back from the Optuna database: the table's identity and its finished runs.

Everything a report needs is in the database (the study's user attributes hold the preset, the
spec rows and the overrides; each complete trial holds its results and dev translations), so a
report can be built on any machine that reaches the storage, without the run directories. Each
run's convergence class is decided here, by the current rule, from the inputs the run stored
(`lightning_modules.convergence.classify_stored`), never taken from the class it recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from lightning_modules.convergence import classify_stored
from lightning_modules.base.errors import UserError
from lightning_modules.run.results import RunResult
from lightning_modules.base.schema import read
from sweeps.storage import make_storage, safe_url
from sweeps.study import KIND, REDO_OF, aside_name, run_name, superseded, unpack_lines

RUN_COLUMNS = RunResult.keys("column")  # ppl, bleu, params, train_time_s, tokens_per_s, ...


@dataclass
class Table3Data:
    """One Table 3 study: what it is a table of, and one record per complete (row, seed)."""

    study: str
    storage: str  # the URL with any password masked
    preset: str
    spec: dict[str, dict[str, Any]]
    overrides: list[str]
    setup: dict[str, Any]  # scale rule, corpus, vocabulary, beam settings of the table
    runs: pd.DataFrame  # row, group, seed, RUN_COLUMNS, model keys, sacrebleu_signature, device
    translations: dict[tuple[str, int], tuple[list[str], list[str]]] = field(default_factory=dict)
    curves: pd.DataFrame = field(default_factory=pd.DataFrame)  # row, seed, step, ppl, convergence
    planned: dict[str, int] = field(default_factory=dict)  # row -> seeds queued, whatever their state
    # runs a redo (`ablate table3 --redo`) replaced or is replacing: row, seed, trial, ppl, bleu,
    # by (the redo's trial number), whether the redo is complete, and the folder it set the run aside as
    redone: pd.DataFrame = field(default_factory=pd.DataFrame)


SETUP_KEYS = ("cpu", "cpu_flags", "cpu_capability", "variables", "gpu", "torch", "torch_threads", "precision",
              "deterministic_algorithms")


def setup_key(environment: dict[str, Any] | None) -> str | None:
    """What makes two runs of one configuration comparable bit for bit (None: not recorded)."""
    if not environment:
        return None
    return "; ".join(f"{k} {environment[k]}" for k in SETUP_KEYS if environment.get(k) not in (None, [], {}))


def load_table3(storage_url: str, study_name: str | None = None) -> Table3Data:
    """The study's runs as a DataFrame (latest complete trial of each row and seed)."""
    storage = make_storage(storage_url, None, existing=True)  # reading creates or changes no database
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
             if s.user_attrs.get("kind") == KIND]
    if study_name is None:
        if len(names) != 1:
            listed = ", ".join(names) if names else "none"
            raise UserError(f"storage {safe_url(storage_url)} holds {len(names)} Table 3 studies "
                            f"({listed}); choose one with --study")
        study_name = names[0]
    elif study_name not in names:
        raise UserError(f"no Table 3 study {study_name!r} in {safe_url(storage_url)} "
                        f"(Table 3 studies there: {', '.join(names) or 'none'})")
    study = optuna.load_study(study_name=study_name, storage=storage)
    attrs = read("table", study.user_attrs, f"study {study_name!r}")
    latest: dict[tuple[str, int], optuna.trial.FrozenTrial] = {}
    queued: dict[str, set[int]] = {}
    trials = study.get_trials(deepcopy=False)
    replaced = superseded(trials)

    def newest(t: optuna.trial.FrozenTrial) -> tuple[bool, int]:  # a redo's run, once complete, before the one it replaces
        return t.number not in replaced, t.number

    for trial in trials:
        key = (trial.user_attrs.get("row"), trial.user_attrs.get("seed"))
        if key[0] is None:
            continue
        queued.setdefault(key[0], set()).add(key[1])
        if trial.state == TrialState.COMPLETE and (key not in latest or newest(trial) > newest(latest[key])):
            latest[key] = trial
    redone = in_table_order(redone_runs(trials, latest), attrs["spec"])
    records, translations, curve_points = [], {}, []
    for (row, seed), trial in latest.items():
        check_numbers(trial, row, seed, study_name)
        verdict = classify_stored(trial.user_attrs)  # None (unclassified): no inputs, whatever class it recorded
        a = {**trial.user_attrs, "convergence": verdict and verdict.label,
             "convergence_reason": verdict and verdict.reason}
        record = {"row": row, "group": a.get("group", row), "seed": seed,
                  **{c: a.get(c) for c in RUN_COLUMNS},
                  "sacrebleu_signature": a.get("sacrebleu_signature"), "device": a.get("device"),
                  "setup": setup_key(a.get("environment")), "run_dir": a.get("run_dir")}
        record.update({f"model.{k}": v for k, v in (a.get("model") or {}).items()})
        records.append(record)
        curve_points += [{"row": row, "seed": seed, "step": step, "ppl": ppl,
                          "convergence": a.get("convergence")} for step, ppl in a.get("dev_ppl_curve") or []]
        if "dev_hyp" in a and "dev_ref" in a:
            translations[(row, seed)] = (unpack_lines(a["dev_hyp"]), unpack_lines(a["dev_ref"]))
    runs = pd.DataFrame.from_records(records, columns=None if records else ["row", "group", "seed"])
    if records:
        runs = in_table_order(runs, attrs["spec"])
    return Table3Data(study=study_name, storage=safe_url(storage_url), preset=attrs["preset"],
                      spec=attrs["spec"], overrides=list(attrs.get("overrides", [])),
                      setup=dict(attrs.get("setup", {})), runs=runs,
                      translations=translations, curves=pd.DataFrame.from_records(curve_points),
                      planned={row: len(seeds) for row, seeds in queued.items()}, redone=redone)


NUMBER_COLUMNS = tuple(c for c in RUN_COLUMNS if c != "convergence")  # what a report computes with


def check_numbers(trial: optuna.trial.FrozenTrial, row: str, seed: Any, study: str) -> None:
    """A complete run's numbers as a report computes with them: finite numbers or none. A value a
    run cannot have written (the text "high" for BLEU, Infinity for PPL: an edited database) is one
    line naming the trial, not a traceback from the formatting or the statistics."""
    for key in NUMBER_COLUMNS:
        value = trial.user_attrs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"study {study!r}: trial {trial.number} ({row} seed {seed}) holds {key} = "
                            f"{str(value)[:40]!r}, not a finite number; a run never writes that (was the "
                            f"database edited?): correct or delete the trial")


def in_table_order(frame: pd.DataFrame, spec: dict[str, Any]) -> pd.DataFrame:
    """`frame`'s records (with columns row and seed) in the spec's row order, then by seed."""
    order = {name: i for i, name in enumerate(spec)}
    return frame.sort_values(["row", "seed"], key=lambda s: s.map(order) if s.name == "row" else s).reset_index(drop=True)


def redone_runs(trials: list[optuna.trial.FrozenTrial],
                latest: dict[tuple[str, int], optuna.trial.FrozenTrial]) -> pd.DataFrame:
    """One record per complete trial a redo names (`ablate table3 --redo`): the report uses the redo once it
    is complete (the newest complete trial of its row and seed) and the old run until then."""
    by_number = {t.number: t for t in trials}
    records: dict[int, dict[str, Any]] = {}  # by the old trial's number: a redo's retry copies name it too
    for trial in trials:
        old = by_number.get(trial.user_attrs.get(REDO_OF))
        if old is None or old.state != TrialState.COMPLETE or old.number in records:
            continue
        key = (old.user_attrs.get("row"), old.user_attrs.get("seed"))
        done = key in latest and latest[key].number != old.number
        records[old.number] = {"row": key[0], "seed": key[1], "trial": old.number, "ppl": old.user_attrs.get("ppl"),
                               "bleu": old.user_attrs.get("bleu"), "by": latest[key].number if done else trial.number,
                               "done": done, "kept_as": aside_name(run_name(*key), old.number)}
    return pd.DataFrame.from_records(list(records.values()),
                                     columns=["row", "seed", "trial", "ppl", "bleu", "by", "done", "kept_as"])
