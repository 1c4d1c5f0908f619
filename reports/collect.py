"""Read a Table 3 study back from the Optuna database, which holds all a report needs; each run's
convergence class by the current rule from its stored inputs (`convergence.classify_stored`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from lightning_modules.convergence import classify_stored
from foundation.errors import UserError
from foundation.records import FinitePair, unpack_lines, validated
from lightning_modules.run.results import RunResult
from sweeps.storage import make_storage, safe_url
from ablations.record import KIND, TUNE, TUNING, TunedRow, aside_name, read_table, run_name, tuned_rows
from sweeps.study import REDO_OF, superseded

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
    # runs a redo replaced or is replacing (`redone_runs`)
    redone: pd.DataFrame = field(default_factory=pd.DataFrame)
    # a tuned table: what was tuned, each decided row's tuning, the table at each row's chosen value
    tuning: dict[str, Any] = field(default_factory=dict)
    tuned_rows: dict[str, TunedRow] = field(default_factory=dict)
    tuned: Table3Data | None = None


SETUP_KEYS = ("cpu", "cpu_flags", "cpu_capability", "variables", "gpu", "torch", "torch_threads", "precision",
              "deterministic_algorithms")


def setup_key(environment: dict[str, Any] | None) -> str | None:
    """What makes two runs of one configuration comparable bit for bit (None: not recorded)."""
    if not environment:
        return None
    return "; ".join(f"{k} {environment[k]}" for k in SETUP_KEYS if environment.get(k) not in (None, [], {}))


def load_table3(storage_url: str, study_name: str | None = None) -> Table3Data:
    """The study's runs as a DataFrame (latest complete trial of each row and seed)."""
    storage = make_storage(storage_url, None, read_only=True)  # reading creates or changes no database
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
    attrs = read_table(study.user_attrs, f"study {study_name!r}")
    latest: dict[tuple[str, int], optuna.trial.FrozenTrial] = {}
    tuned: dict[tuple[str, int, str], optuna.trial.FrozenTrial] = {}  # complete tuned runs, by their setting too
    queued: dict[str, set[int]] = {}
    trials = study.get_trials(deepcopy=False)
    replaced = superseded(trials)

    def newest(t: optuna.trial.FrozenTrial) -> tuple[bool, int]:  # a redo's run, once complete, before the one it replaces
        return t.number not in replaced, t.number

    for trial in trials:
        if trial.user_attrs.get("row") is None:
            continue
        key = run_key(trial, study_name)
        if key[0] is None:
            continue
        if TUNE in trial.user_attrs:
            if trial.state == TrialState.COMPLETE:
                tuned[(*key, repr(trial.user_attrs[TUNE]))] = trial  # in number order: the newest wins
            continue
        queued.setdefault(key[0], set()).add(key[1])
        if trial.state == TrialState.COMPLETE and (key not in latest or newest(trial) > newest(latest[key])):
            latest[key] = trial
    redone = in_table_order(redone_runs(trials, latest), attrs["spec"])
    planned = {row: len(seeds) for row, seeds in queued.items()}
    data = Table3Data(study=study_name, storage=safe_url(storage_url), preset=attrs["preset"], spec=attrs["spec"],
                      overrides=list(attrs.get("overrides", [])), setup=dict(attrs.get("setup", {})),
                      **complete_runs(latest, attrs["spec"], study_name), planned=planned, redone=redone)
    if not attrs.get(TUNING):
        return data
    decided = tuned_rows(attrs, f"study {study_name!r}")
    moved = {row: repr(record.chosen) for row, record in decided.items() if record.chosen not in (None, record.own)}
    chosen = {key: trial for key, trial in latest.items() if key[0] in decided and key[0] not in moved}
    chosen |= {(row, seed): trial for (row, seed, setting), trial in tuned.items() if moved.get(row) == setting}
    return replace(data, tuning=attrs[TUNING], tuned_rows=decided,
                   tuned=replace(data, **complete_runs(chosen, attrs["spec"], study_name), redone=redone.iloc[:0]))


def complete_runs(latest: dict[tuple[str, int], optuna.trial.FrozenTrial], spec: dict[str, Any],
                  study_name: str) -> dict[str, Any]:
    """A table's runs, dev translations and curves (`Table3Data`'s) from its complete trials."""
    records, translations, curve_points = [], {}, []
    for (row, seed), trial in latest.items():
        source = f"study {study_name!r}: trial {trial.number} ({row} seed {seed})"
        result = stored_result(trial, source)
        verdict = classify_stored(trial.user_attrs)  # None (unclassified): no inputs, whatever class it recorded
        record = {"row": row, "group": trial.user_attrs.get("group", row), "seed": seed,
                  **{c: getattr(result, c) for c in RUN_COLUMNS}, "convergence": verdict and verdict.label,
                  "sacrebleu_signature": result.sacrebleu_signature, "device": result.device,
                  "setup": setup_key(result.environment), "run_dir": trial.user_attrs.get("run_dir")}
        record.update({f"model.{k}": v for k, v in (result.model or {}).items()})
        records.append(record)
        curve_points += [{"row": row, "seed": seed, "step": step, "ppl": ppl,
                          "convergence": verdict and verdict.label} for step, ppl in result.dev_ppl_curve or []]
        if "dev_hyp" in trial.user_attrs and "dev_ref" in trial.user_attrs:
            translations[(row, seed)] = stored_translations(trial, source)
    runs = pd.DataFrame.from_records(records, columns=None if records else ["row", "group", "seed"])
    if records:
        runs = in_table_order(runs, spec)
    return {"runs": runs, "translations": translations, "curves": pd.DataFrame.from_records(curve_points)}


RESULT_KEYS = {f.name for f in fields(RunResult)}


def run_key(trial: optuna.trial.FrozenTrial, study: str) -> tuple[str, int]:
    """A trial's (row, seed), typed (`foundation.records`): a seed stored as "3" is 3."""
    source = f"study {study!r}: trial {trial.number}"
    return (validated(str, trial.user_attrs.get("row"), f"{source}: row"),
            validated(int, trial.user_attrs.get("seed"), f"{source}: seed"))


def stored_result(trial: optuna.trial.FrozenTrial, source: str) -> RunResult:
    """A complete trial's results, typed once, or one line naming the trial and field."""
    result = validated(RunResult, {k: v for k, v in trial.user_attrs.items() if k in RESULT_KEYS}, source)
    validated(list[FinitePair], result.dev_ppl_curve or [], f"{source}: dev_ppl_curve")
    return result


def stored_translations(trial: optuna.trial.FrozenTrial, source: str) -> tuple[list[str], list[str]]:
    """A trial's packed dev translations and references, a translation for every reference, or one line."""
    hyp = unpack_lines(trial.user_attrs["dev_hyp"], f"{source}: dev_hyp")
    ref = unpack_lines(trial.user_attrs["dev_ref"], f"{source}: dev_ref")
    if len(hyp) != len(ref):
        raise UserError(f"{source}: {len(hyp):,} dev translations for {len(ref):,} references; a run stores "
                        f"one for each (was the database edited?): correct or delete the trial")
    return hyp, ref


def in_table_order(frame: pd.DataFrame, spec: dict[str, Any]) -> pd.DataFrame:
    """`frame`'s records (with columns row and seed) in the spec's row order, then by seed."""
    order = {name: i for i, name in enumerate(spec)}
    return frame.sort_values(["row", "seed"], key=lambda s: s.map(order) if s.name == "row" else s).reset_index(drop=True)


def redone_runs(trials: list[optuna.trial.FrozenTrial],
                latest: dict[tuple[str, int], optuna.trial.FrozenTrial]) -> pd.DataFrame:
    """One record per complete trial a redo names (`ablate table3 --redo`)."""
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
