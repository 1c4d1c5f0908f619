"""Table 3 as a queue: every (row, seed) not yet complete becomes a queued trial of one study.

The sweep workers (`sweeps.worker`, queue-only) take the trials, so Table 3 runs on one CPU, on
the GPUs of one machine, or on many machines sharing a PostgreSQL study, like any sweep.
Each (row, seed) trains in `<runs_dir>/<study>/<row>-s<seed>`; a re-run queues only what is not
complete, and a killed trial resumes there from its checkpoint.

The study remembers what it is a table of in its user attributes (`table_record`): each planned
run's configuration (`identity`), and the preset, spec rows and overrides the report reads, so the
report needs nothing but the database; a re-run that would train any of those runs differently is
refused (`table_difference`) instead of mixing two tables.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from ablations.resolve import Recipe, Resolver, load_config_file, parse_overrides
from ablations.spec import (RECIPE_SECTIONS, SCALED_KEYS, default_rows, default_seeds, default_spec_path, load_preset,
                            load_spec, one_seed_rows, recipe_changes)
from lightning_modules.config import RunConfig, check_seed, computed_config, trained_part
from foundation.errors import EXIT_INTERRUPTED, UserError, did_you_mean
from foundation.names import check_name, inside
from foundation.rundir import check_apart, refuse_foreign
from foundation.faults import inject
from foundation.io import check_writable_dir
from lightning_modules.run.results import read_results
from tables.redo import aside, redo_requests
from tables.schedule import longest_first, training_flops
from foundation.schema import stamped
from sweeps.storage import make_storage, safe_url
from ablations.record import CORPUS, KIND, TUNE, TUNED, TUNING, TunedRow, read_table, run_name, tuned_name
from sweeps.optuna_api import replay
from sweeps.study import PRUNING, REDO_OF, enqueue, in_cohort, make_pruner, open_study, superseded
from tables import tune



@dataclass(frozen=True)
class Table3Plan:
    """What to run: the study, the rows and seeds, and the `ablate train` options for all of them."""

    study: str
    storage: str
    preset: str
    rows: list[str]
    seeds: list[int]
    runs_dir: str
    overrides: list[str]
    spec_path: str | None = None
    config: str | None = None
    one_seed_rows: list[str] = field(default_factory=list)  # run with the first seed only
    redo: list[str] = field(default_factory=list)  # rows whose finished runs train again (`tables.redo`)
    tuning: tune.Tuning | None = None  # --tune: every row also at its own best value (`tables.tune`)
    # each row's configuration, resolved once (`config_of`), by the plan's own reading of its files
    _resolver: Resolver | None = field(default=None, init=False, repr=False, compare=False)
    _rows: dict[str, RunConfig] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def recipe(self) -> Recipe:
        """What every run of the table is made from, but its row and seed."""
        return Recipe(self.preset, "base", self.config, self.spec_path, tuple(self.overrides))

    @property
    def resolver(self) -> Resolver:
        if self._resolver is None:
            object.__setattr__(self, "_resolver", Resolver(self.recipe))
        return self._resolver

    @property
    def spec(self) -> dict[str, dict[str, Any]]:
        """The ablation spec's rows, as the plan read them."""
        return self.resolver.spec

    def config_of(self, row: str, seed: int | None = None) -> RunConfig:
        """The configuration (row, seed) trains with, its row resolved once: a seed changes
        train.seed alone (`seed_overrides`; tests/test_table3.py checks it against resolving the
        run with its seed override). Without a seed: the row's with the first planned seed."""
        if row not in self._rows:
            self._rows[row] = self.resolver.resolve(row)
        seed = self.seeds[0] if seed is None else seed  # checked where the seeds are read (`parse_seeds`)
        cfg = copy.deepcopy(self._rows[row])  # a caller's changes stay its own
        return replace(cfg, train=replace(cfg.train, seed=seed))

    @property
    def base(self) -> RunConfig:
        return self.config_of("base")

    def run_dirs(self) -> dict[tuple[str, int], Path]:
        """Each planned run's directory on this machine (`run_dir`), a tuned run's by its tuned row's
        name (`tuned_name`): those a tuning may train too."""
        named = [*self.runs(), *((tuned_name(row, setting), seed) for row, seed, setting in self.tuned_runs())]
        return {(row, seed): Path(run_dir(self, row, seed)) for row, seed in named}

    def own(self, row: str) -> dict[str, Any]:
        """The row's value of each tuned key, as the untuned table trains it."""
        assert self.tuning is not None
        return self.tuning.own(self.config_of(row))

    def tuned_runs(self) -> list[tuple[str, int, dict[str, Any]]]:
        """Every run a tuning may train besides the table's own: each row's candidates but its own
        on the tuning seed, the first (`tables.tune`), and on its other seeds (the chosen one's)."""
        if self.tuning is None:
            return []
        return [(row, seed, setting) for row in self.rows for setting in self.tuning.candidates(self.own(row))[1:]
                for seed in self.seeds_of(row)]

    def seeds_of(self, row: str) -> list[int]:
        return self.seeds[:1] if row in self.one_seed_rows else self.seeds

    def runs(self) -> list[tuple[str, int]]:
        """Every planned (row, seed), rows in order."""
        return [(row, seed) for row in self.rows for seed in self.seeds_of(row)]

    def describe_seeds(self) -> str:
        """'3 seeds' or '3 seeds (1 for C1, D1)'."""
        text = f"{len(self.seeds)} seed{'s' * (len(self.seeds) != 1)}"
        single = [row for row in self.rows if row in self.one_seed_rows]
        return f"{text} (1 for {', '.join(single)})" if single and len(self.seeds) > 1 else text


def make_plan(preset: str, storage: str, runs_dir: str, overrides: list[str], rows: str | None = None,
              seeds: str | None = None, study: str | None = None, spec_path: str | None = None,
              config: str | None = None, every_seed: bool = False, redo: str | None = None,
              tune_values: list[str] | None = None, tune_budget: float | None = None) -> Table3Plan:
    """The plan of `ablate table3`: rows (`base,A,D3`; default: the preset's, else the spec's),
    seeds (`1,2`; default: the preset's `table3.seeds`, else the resolved train.seed; rows the
    preset's one-seed rule names get the first only, unless `every_seed`), study name (default
    `SPEC-PRESET`, `default_study`), rows to redo (`base,C5`: rows or groups of the table), the
    settings `--tune` tries and its `--tune-budget` (`tables.tune.parse_tuning`)."""
    from lightning_modules.run.preflight import check_hardware  # loads torch: only once a plan is made

    name = check_name(study or default_study(preset, spec_path), "study name")  # before anything is written
    resolver = Resolver(Recipe(preset, "base", config, spec_path, tuple(overrides)))
    spec = resolver.spec
    chosen = select_rows(rows, spec, default_rows(preset) if spec_path is None else None)
    seed_list = parse_seeds(seeds, default_seeds(preset) or [int(resolver.setting("train.seed"))])
    single = [] if every_seed else [row for row in one_seed_rows(preset, spec) if row in chosen]
    again = [] if redo is None else select_rows(redo, spec, None, with_base=False, option="--redo")
    if outside := [row for row in again if row not in chosen]:
        raise UserError(f"--redo names rows the table does not run ({', '.join(outside)}); "
                        f"its rows: {', '.join(chosen)}")
    tuning = tune.parse_tuning(tune_values, tune_budget, resolver)
    if tuning and (own := [(row, key) for row in chosen for key in tuning.values if key in recipe_changes(row, spec)]):
        raise UserError(f"--tune {own[0][1]}: row {own[0][0]} sets it itself (it is what the row changes); tune "
                        f"another setting or leave the row out (--rows)")
    plan = Table3Plan(study=name, storage=storage, preset=preset, rows=chosen,
                      seeds=seed_list, runs_dir=runs_dir, overrides=overrides, spec_path=spec_path,
                      config=config, one_seed_rows=single, redo=again, tuning=tuning)
    object.__setattr__(plan, "_resolver", resolver)
    check_hardware(plan.base)
    return plan


def base_steps_overrides(max_steps: int, spec_path: str | None = None) -> list[str]:
    """`ablate table3 --max-steps N`: base trains N steps and every row keeps its ratio to base's
    steps (the paper's big trains 3x as long), by the preset's rule for steps (`scale.steps`, set so
    that base's `train_steps` becomes N); `train.max_steps=N` where the spec's base states none."""
    steps = load_spec(spec_path)["base"].get("train_steps")
    return [f"scale.steps={max_steps / steps!r}"] if steps else [f"train.max_steps={max_steps}"]


def default_study(preset: str, spec_path: str | None = None) -> str:
    """`table3-PRESET` for the paper's table, `SPEC-PRESET` for another spec (its file name without
    `.yaml`: `modifications-cpu`), so that two tables run in one storage never meet in one study
    (a study holds one table: the second would be refused for rows its spec lacks)."""
    return f"{Path(spec_path).stem if spec_path else 'table3'}-{preset}"


def select_rows(selection: str | None, spec: dict[str, dict[str, Any]], default: list[str] | None,
                with_base: bool = True, option: str = "--rows") -> list[str]:
    """`base,A,D3`: row names or group names (A = A1..A4), in the spec's order; base always first
    (unless not `with_base`: the rows of `--redo`)."""
    if selection is None:
        wanted = list(default or spec)
    else:
        wanted = [s.strip() for s in selection.split(",") if s.strip()]
        if not wanted:
            raise UserError(f"{option} is empty; give rows or groups like base,A,D3")
    groups: dict[str, list[str]] = {}
    for name, entry in spec.items():
        groups.setdefault(str(entry.get("group", name)), []).append(name)
    chosen: set[str] = {"base"} if with_base else set()  # every change is measured against base
    for item in wanted:
        if item in spec:
            chosen.add(item)
        elif item in groups:
            chosen.update(groups[item])
        else:
            raise UserError(f"unknown Table 3 row or group {item!r}{did_you_mean(item, [*spec, *groups])}; "
                            f"rows: {', '.join(spec)}")
    return [name for name in spec if name in chosen]


def parse_seeds(text: str | None, default: list[int]) -> list[int]:
    if text is None:
        return default
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds must be integers like 1,2,3; got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds must list distinct integers like 1,2,3; got {text!r}")
    for seed in seeds:  # before any data is prepared
        check_seed(seed)
    return seeds


def check_data(plan: Table3Plan) -> dict[str, str]:
    """Prepare each distinct data setting of the planned rows once, in a scratch directory (see
    `preflight.prepare_data`): a table whose data leaves no pairs fails in one line before anything
    is queued, instead of in every trial. Returns each row's corpus digest, which the study keeps
    (`check_study`): machines of one study may read the corpus from different places, but it must
    be the same text."""
    from lightning_modules.run.preflight import prepare_data  # loads the data stack

    digests: dict[str, str] = {}
    rows: dict[str, str] = {}
    for row in plan.rows:
        cfg = plan.config_of(row)
        key = repr((cfg.data, cfg.model.max_len))
        if key not in digests:
            digests[key] = prepare_data(cfg)
        rows[row] = digests[key]
    return rows


def run_dir(plan: Table3Plan, row: str, seed: int) -> str:
    """A (row, seed)'s run directory on this machine (checked to stay inside the runs directory)."""
    return str(inside(plan.runs_dir, plan.study, run_name(row, seed)))


def run_configs(plan: Table3Plan, runs: list[tuple[str, int]] | None = None) -> dict[tuple[str, int], RunConfig]:
    """The configuration of each planned (row, seed) (or each of `runs`): `Table3Plan.config_of`."""
    return {(row, seed): plan.config_of(row, seed) for row, seed in (plan.runs() if runs is None else runs)}


def table_record(plan: Table3Plan, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a study's user attributes and an archive's `table3.json` hold: `runs`, the identity of
    every run the table has planned so far (`identity`), and what the report reads: the preset, the
    spec's entries of the table's rows (those of `runs` and the plan's: a row the spec file gained
    since is no part of the table until a sitting plans it), the overrides, the --config file and
    the setup its caption names."""
    cfg = plan.base
    setup = {"scale": asdict(cfg.scale), "corpus": cfg.data.corpus, "vocab_size": cfg.data.vocab_size,
             "max_tokens": cfg.data.max_tokens, "beam_size": cfg.eval.beam_size,
             "length_penalty": cfg.eval.length_penalty}
    tuned = {TUNING: plan.tuning.record(plan.seeds[0])} if plan.tuning else {}
    return stamped({"kind": KIND, "preset": plan.preset, "spec": table_spec(plan, runs), "overrides": plan.overrides,
                    "config": plan.config, "setup": setup, "runs": runs, **tuned})


def table_spec(plan: Table3Plan, runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The spec's entries of the table's rows, in the spec's order: those of `runs` (recorded and
    planned) and the plan's. A row the spec file gained since is no part of the table until a
    sitting plans it, so a table re-run as it was records what it recorded."""
    rows = {str(config.get("row")) for config in runs.values()} | set(plan.rows)
    return {row: entry for row, entry in plan.spec.items() if row in rows}


def identity(plan: Table3Plan, runs: list[tuple[str, int]] | None = None) -> dict[str, dict[str, Any]]:
    """What the table is, the one answer to "is this the same table": for each planned (row,
    seed) (or each of `runs`), by its run's name, the configuration it trains with as requested,
    less the fields that choose only where output goes or where input is read from
    (`config.computed_config`; e.g. W&B, checkpoint cadence, --data-dir), as JSON stores it. The
    corpus's content is the table's too (`check_data`'s digest, in the record)."""
    planned = plan.runs() if runs is None else runs
    return identity_of(run_configs(plan, planned))


def identity_of(configs: dict[tuple[str, int], RunConfig]) -> dict[str, dict[str, Any]]:
    """`identity` from the runs' configurations at hand."""
    return json.loads(json.dumps({run_name(row, seed): computed_config(cfg) for (row, seed), cfg in configs.items()}))


def table_difference(stored: dict[str, Any], plan: Table3Plan,
                     wanted: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """How the table `stored` (a study's user attributes, an archive's table3.json, as `schema.read`
    gives them) differs from
    the one `plan` makes (`wanted`: its identity): what differs (the preset, the overrides, or the
    configuration from the files that set the changed keys, named), and the changes, there -> here;
    None for the same table.

    Every run `stored` names is compared with the same run as `plan` would train it, planned
    this time or not, so a sitting of other rows or seeds is checked too. A field its
    configuration lacks (one added to the config since) reads as that field's default."""
    there = stored["runs"]
    spec = plan.spec
    gone = sorted({str(config.get("row")) for config in there.values()} - set(spec))
    if gone:
        return "rows", f"{', '.join(gone)} not in the ablation spec {plan.spec_path or default_spec_path()} here"
    more = [(config["row"], config["train"]["seed"]) for name, config in there.items() if name not in wanted]
    here = {**wanted, **identity(plan, more)}
    defaults = computed_config(RunConfig())
    changes: dict[tuple[str, Any, Any], list[str]] = {}
    for name, config in there.items():
        for change in _differences(_with_defaults(trained_part(config), defaults), here[name]):
            changes.setdefault(change, []).append(name)
    if not changes:
        return None
    if preset := [(old, new) for path, old, new in changes if path == "preset"]:
        return "preset", f"{preset[0][0]!r} -> {preset[0][1]!r}; there -> here"
    shown = [f"{path}: {old!r} -> {new!r}" + ("" if len(names) == len(there) else f" in {_some(names)}")
             for (path, old, new), names in changes.items()]
    more_text = f"; and {len(shown) - 4} more" if len(shown) > 4 else ""
    return (_changed_by(plan, stored, {path for path, _, _ in changes}),
            "; ".join(shown[:4]) + more_text + "; there -> here")


def recorded_runs(there: dict[str, Any], wanted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The runs a table records from now on (study, archive): those recorded before, as they were
    (the same table by `table_difference`, where a field added to the config since reads as its
    default, so a new field does not rewrite the record), then the runs planned for the first time."""
    return {**there, **{name: config for name, config in wanted.items() if name not in there}}


def _some(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 3 else f"{len(names)} runs ({', '.join(names[:2])}, ...)"


def _differences(there: Any, here: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(key, there, here) for each leaf where two nested dicts differ."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [change for key in sorted(set(there) | set(here), key=str)
                for change in _differences(there.get(key), here.get(key), f"{prefix}{key}.")]
    return [] if there == here else [(prefix.rstrip("."), there, here)]


def _with_defaults(stored: Any, defaults: Any) -> Any:
    """A stored configuration with the fields it lacks at their defaults."""
    if not (isinstance(stored, dict) and isinstance(defaults, dict)):
        return stored
    return {**defaults, **{key: _with_defaults(value, defaults.get(key)) for key, value in stored.items()}}


def _changed_by(plan: Table3Plan, stored: dict[str, Any], keys: set[str]) -> str:
    """What sets the changed `keys`: "overrides" when this sitting's or the stored table's do, else
    the configuration from the file that sets each here, the first of the --config file, the
    ablation spec and the preset's file (as `resolve` ranks them), or the defaults in
    lightning_modules/config.py."""
    if keys & (_override_keys(plan.overrides) | _override_keys(stored.get("overrides") or [])):
        return "overrides"
    spec = plan.spec
    row_keys = {f"model.{key}" for row in spec.values() for key in row.get("model", {})}
    row_keys |= {"train.max_steps"} if any("train_steps" in row for row in spec.values()) else set()
    row_keys |= {f"{section}.{key}" for row in spec.values() for section in RECIPE_SECTIONS
                 for key in row.get(section, {})}
    files = {f"the --config file {plan.config}": _leaf_keys(load_config_file(plan.config)) if plan.config else set(),
             f"the ablation spec {plan.spec_path or default_spec_path()}": row_keys,
             f"the preset's file ablations/presets/{plan.preset}.yaml": _leaf_keys(load_preset(plan.preset))}
    named = dict.fromkeys(next((name for name, set_there in files.items() if key in set_there),
                               "the defaults in lightning_modules/config.py") for key in sorted(keys))
    return "configuration from " + " and ".join(named)


def _override_keys(items: list[Any]) -> set[str]:
    """The keys overrides set, the rows' keys a scale override sets among them (`SCALED_KEYS`)."""
    keys = _leaf_keys(parse_overrides([str(item) for item in items]))
    return keys.union(*(SCALED_KEYS.get(key, set()) for key in keys))


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> set[str]:
    """`model.d_model`, ... for each leaf of a nested dict."""
    return {key for name, value in values.items()
            for key in (_leaf_keys(value, f"{prefix}{name}.") if isinstance(value, dict) else [f"{prefix}{name}"])}


def check_study(study: optuna.Study, plan: Table3Plan, wanted: dict[str, dict[str, Any]],
                record: bool = True, corpus: dict[str, str] | None = None) -> None:
    """Refuse a study of another table, or of a sweep (`table_difference`), or of the same
    settings on another corpus text (`corpus`: each planned row's digest, `check_data`). With
    `record`, store the table on a new study (`table_record`), and on an old one the runs and
    corpus digests this sitting adds."""
    attrs = study.user_attrs
    if "kind" not in attrs:
        if study.get_trials(deepcopy=False):
            raise UserError(f"study {study.study_name!r} holds a sweep, not a Table 3: use another --study")
        if record:  # "kind" last: a launcher that reads the study meanwhile sees a new study or a whole record
            made = {**table_record(plan, wanted), **({CORPUS: corpus} if corpus else {})}
            for key in sorted(made, key=lambda key: key == "kind"):
                study.set_user_attr(key, made[key])
        return
    attrs = read_table(attrs, f"study {study.study_name!r}")
    difference = table_difference(attrs, plan, wanted)
    if difference is not None:
        what, changes = difference
        raise UserError(f"study {study.study_name!r} is a Table 3 that differs in its {what} ({changes}): the "
                        f"runs still queued would not be comparable to those done. Use another --study")
    if plan.tuning and attrs.get(TUNING) and attrs[TUNING] != (tuned := plan.tuning.record(plan.seeds[0])):
        raise UserError(f"study {study.study_name!r} is a Table 3 tuned otherwise ({attrs[TUNING]} there, {tuned} "
                        f"here): its candidates would not be comparable. Use another --study")
    known = attrs.get(CORPUS) or {}
    other = sorted(row for row, digest in (corpus or {}).items() if known.get(row, digest) != digest)
    if other:
        raise UserError(f"study {study.study_name!r} is a Table 3 trained on other text under the same corpus "
                        f"settings (the corpus read here differs from the one its runs read, for "
                        f"{_some(other)}): the runs would not be comparable. Point --data-dir or --base-url "
                        f"at the same corpus, or use another --study")
    if record:  # the runs this sitting adds, and the spec's entries of the table's rows as the report is to read them
        runs = recorded_runs(attrs["runs"], wanted)
        updates = {"runs": runs, "spec": table_spec(plan, runs), **({CORPUS: {**known, **corpus}} if corpus else {}),
                   **({TUNING: plan.tuning.record(plan.seeds[0])} if plan.tuning else {})}
        for key, value in updates.items():
            if attrs.get(key) != value:
                study.set_user_attr(key, value)


def check_archive(archive: Path, plan: Table3Plan, wanted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Refuse an `--archive` of another table (see `tables.archive`); returns the record its
    table3.json is to hold from now on (`table_record`: its runs and this sitting's)."""
    from tables.archive import stored_identity

    stored = stored_identity(archive)
    if stored is None:
        return table_record(plan, wanted)
    difference = table_difference(stored, plan, wanted)
    if difference is not None:
        what, changes = difference
        raise UserError(f"--archive {archive} holds another table ({what}: {changes}): use another --archive")
    return table_record(plan, recorded_runs(stored["runs"], wanted))


def complete_in(run_dir: Path) -> bool:
    """Whether a run directory holds a complete results.json (the workers adopt it as it is)."""
    done = read_results(run_dir)
    return done is not None and done.complete


def queue(plan: Table3Plan, archive: Path | None = None, storage: BaseStorage | None = None,
          corpus: dict[str, str] | None = None) -> tuple[optuna.Study, int]:
    """Validate every (row, seed), then queue those not complete, costliest first, and the redos
    the plan asks for (`tables.redo`). `archive`: the table's --archive, whose study comes into a
    storage that lacks it (`tables.archive.restore_study`) and whose entries of redone runs are
    set aside too; `corpus`: the rows' corpus digests (`check_data`), checked against the study's.
    Returns the study and the number queued now."""
    spec = plan.spec
    configs = run_configs(plan)
    storage = storage or make_storage(plan.storage, None)
    if archive is not None:
        from tables.archive import STUDY, restore_study

        if back := restore_study(archive, storage, plan.study):
            print(f"table3 {plan.study}: the study is back from {archive / STUDY} ({back} trials)", flush=True)
    study = open_study(plan.study, storage, "ppl")
    check_study(study, plan, identity_of(configs), corpus=corpus)
    redone = redo(plan, study, spec, archive)
    # Longest first (`tables.schedule`, which the dry run replays): the big model starts at once
    # instead of last; finished run directories the study does not know yet (restored, copied in)
    # go before everything: adopted in seconds, they are in the study from the start.
    done = [run for run in plan.runs() if complete_in(Path(run_dir(plan, *run)))]
    queued = 0
    for row, seed in start_order(configs, done):
        queued += enqueue(study, seed_overrides(seed), trial_attrs(plan, spec, row, seed))
    if plan.tuning is not None:
        queued += queue_tuned(plan, study, storage)
    return study, queued + redone


def start_order(configs: dict[tuple[str, int], RunConfig],
                done: list[tuple[str, int]] = ()) -> list[tuple[str, int]]:
    """The (row, seed)s in the order their trials are queued: finished ones to adopt first, then
    longest first by training FLOPs (`tables.schedule.longest_first`)."""
    return longest_first({run: training_flops(cfg) for run, cfg in configs.items()}, done)


def seed_overrides(seed: int) -> list[str]:
    """What a queued (row, seed) trial changes in its row's configuration (`enqueue` matches on it)."""
    return [f"train.seed={seed}"]


def trial_attrs(plan: Table3Plan, spec: dict[str, Any], row: str, seed: int,
                setting: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a queued (row, seed) trial carries: the report and the workers read these (`run_dir`:
    its run directory relative to the runs directory). A tuned run's (`setting`) carries that too;
    on a tuned table's tuning seed, a run is a candidate of its row's tuning (`pruning`)."""
    name = row if setting is None else tuned_name(row, setting)
    attrs = {"row": row, "seed": seed, "group": spec[row].get("group", row), "run_dir": f"{plan.study}/{run_name(name, seed)}"}
    if setting is not None:
        attrs[TUNE] = setting
    if plan.tuning is not None and seed == plan.seeds[0]:
        attrs[PRUNING] = pruning(plan, row, reference=setting is None)
    return attrs


REPLAYS = "replays"  # a trial's attribute: the number of the finished run it replays into its cohort


def pruning(plan: Table3Plan, row: str, reference: bool) -> dict[str, Any]:
    """How a candidate of a row's tuning is pruned (`sweeps.study.PRUNING`): successive halving
    among the row's candidates, from its first rung; the row's own run is the reference."""
    assert plan.tuning is not None
    return {"pruner": "halving", "min_resource": plan.tuning.first_rung(plan.config_of(row)),
            "cohort": f"tune:{row}", "reference": reference}


def queue_tuned(plan: Table3Plan, study: optuna.Study, storage: BaseStorage, candidates: bool = True) -> int:
    """A tuned table's part of the queue (`tables.tune`): each row's candidates not yet queued (its
    own is the table's run on the tuning seed, replayed into the cohort when it finished untuned),
    the row's record once every candidate has finished (`tune.decide`), then its other seeds at the
    value chosen. `candidates`: False once the workers have run (a failed one is not queued again
    in the same sitting). Returns how many were queued."""
    assert plan.tuning is not None
    spec, first, queued = plan.spec, plan.seeds[0], 0
    settings = {row: plan.tuning.candidates(plan.own(row)) for row in plan.rows}
    trials, runs = study.get_trials(deepcopy=False), status(study, plan)
    for row in plan.rows if candidates else ():
        replayed(plan, storage, row, runs[(row, first)], trials)
        queued += sum(enqueue(study, tune.overrides(first, setting), trial_attrs(plan, spec, row, first, setting))
                      for setting in settings[row][1:])
    trials, runs = study.get_trials(deepcopy=False), status(study, plan)  # with what was queued now
    for row, (own, *others) in settings.items():
        decided = tune.decide(study, row, [(own, runs[(row, first)]),
                                           *((setting, tune.latest(trials, row, first, setting)) for setting in others)])
        if decided and decided.chosen not in (None, own):
            queued += sum(enqueue(study, tune.overrides(seed, decided.chosen),
                                  trial_attrs(plan, spec, row, seed, decided.chosen)) for seed in plan.seeds_of(row)[1:])
    return queued


def replayed(plan: Table3Plan, storage: BaseStorage, row: str, own: optuna.trial.FrozenTrial | None,
             trials: list[optuna.trial.FrozenTrial]) -> None:
    """The row's own run on the tuning seed (`own`) into its cohort (`sweeps.optuna_api.replay`),
    when it finished before the table was tuned (so it reported to no pruner), once."""
    if own is None or own.state != TrialState.COMPLETE or PRUNING in own.user_attrs \
            or any(t.user_attrs.get(REPLAYS) == own.number for t in trials):
        return
    how = pruning(plan, row, reference=True)
    # Trained without a pruner, it reported nothing: its results' curve, each step as logged (from 0)
    curve = {step + 1: ppl for step, ppl in own.user_attrs.get("dev_ppl_curve") or []}  # + 1, as sweeps.pruning reports
    replay(storage, plan.study, own, curve, make_pruner("halving", 0, how["min_resource"]), in_cohort(how["cohort"]),
           {PRUNING: how, REPLAYS: own.number})


def redo(plan: Table3Plan, study: optuna.Study, spec: dict[str, Any], archive: Path | None) -> int:
    """Queue the plan's redos not yet asked for: each old run's archive entry, then its run
    directory, set aside first (a sitting stopped in between asks again: `tables.redo`), then its
    trial. Returns how many."""
    from tables.archive import entry

    wanted = [(row, seed) for row, seed in plan.runs() if row in plan.redo]
    requests = redo_requests(study, wanted, status(study, plan))
    for (row, seed), number in requests.items():
        places = ([entry(archive, row, seed)] if archive else []) + [Path(run_dir(plan, row, seed))]
        moved = [str(target) for target in (aside(place, number) for place in places) if target]
        enqueue(study, seed_overrides(seed), {**trial_attrs(plan, spec, row, seed), REDO_OF: number})
        print(f"table3 {plan.study}: {row} seed {seed} trains again (replacing trial {number}"
              + (f"; its run kept in {', '.join(moved)}" if moved else "") + ")", flush=True)
    return len(requests)


def status(study: optuna.Study, plan: Table3Plan) -> dict[tuple[str, int], optuna.trial.FrozenTrial | None]:
    """The latest trial of each planned (row, seed), or None."""
    latest: dict[tuple[str, int], optuna.trial.FrozenTrial] = {}
    trials = study.get_trials(deepcopy=False)
    replaced = superseded(trials)
    for trial in trials:
        if trial.user_attrs.get("nothing_queued") or trial.number in replaced or TUNE in trial.user_attrs:
            continue  # never ran, redone, or a tuned run
        key = (trial.user_attrs.get("row"), trial.user_attrs.get("seed"))
        if key in latest and latest[key].state == TrialState.COMPLETE:
            continue
        latest[key] = trial
    return {(row, seed): latest.get((row, seed)) for row, seed in plan.runs()}


def print_summary(study: optuna.Study, plan: Table3Plan) -> list[str]:
    """Print a short text table of the planned runs, and say which are not complete; those runs."""
    lines = [f"{'row':<6} {'seed':>4}  {'state':<8} {'dev PPL':>8} {'dev BLEU':>8}  run dir"]
    missing = []
    for (row, seed), trial in status(study, plan).items():
        state = trial.state.name.lower() if trial else "missing"
        attrs = trial.user_attrs if trial else {}
        ppl = f"{attrs['ppl']:.2f}" if attrs.get("ppl") is not None else "-"
        bleu = f"{attrs['bleu']:.2f}" if attrs.get("bleu") is not None else "-"
        lines.append(f"{row:<6} {seed:>4}  {state:<8} {ppl:>8} {bleu:>8}  {run_dir(plan, row, seed)}")
        if not trial or trial.state != TrialState.COMPLETE:
            missing.append(f"{row} seed {seed} ({state})")
    if plan.tuning is not None:
        lines.append("")
        missing += tuning_summary(study, plan, lines)
    print("\n".join(lines), flush=True)
    if missing:
        print(f"table3: not complete: {', '.join(missing)}; see each run directory's trial.log, "
              f"and run the same command again to resume", file=sys.stderr)
    return missing


def tuning_summary(study: optuna.Study, plan: Table3Plan, lines: list[str]) -> list[str]:
    """A line per row of a tuned table's tuning, onto `lines`; what of it is not complete."""
    assert plan.tuning is not None
    missing, trials = [], study.get_trials(deepcopy=False)
    for row in plan.rows:
        if (stored := study.user_attrs.get(TUNED + row)) is None:
            lines.append(f"{row}: tuning not finished")
            missing.append(f"{row}'s tuning")
            continue
        record = TunedRow.model_validate(stored)
        lines.append(f"{row}: {tune.describe(record)}")
        for seed in plan.seeds_of(row)[1:] if record.chosen not in (None, record.own) else ():
            trial = tune.latest(trials, row, seed, record.chosen)
            if trial is None or trial.state != TrialState.COMPLETE:
                missing.append(f"{tuned_name(row, record.chosen)} seed {seed} ({trial.state.name.lower() if trial else 'missing'})")
    return missing


@dataclass
class Table3Outcome:
    """How a Table 3 run ended: the workers' exit status, the (row, seed) runs not complete, and
    the report's files (`tables.make.make_table3`; none when not asked for, or interrupted)."""

    workers_status: int
    missing: list[str]
    report: list[Path] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return self.workers_status == EXIT_INTERRUPTED

    @property
    def exit_status(self) -> int:
        """0 when every planned run is complete and every worker ended cleanly, 130 interrupted, else 1."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 1 if self.missing or self.workers_status else 0


def check_places(plan: Table3Plan, archive: str | None = None, report: Path | None = None) -> None:
    """Before a table writes anything (a dry run writes nothing, and checks none of this): the run
    directories can be written, they, the archive and the report's folder are apart
    (`rundir.check_apart`), and the report's folder is new, empty or a report's."""
    places = [("--runs-dir", path) for path in plan.run_dirs().values()] \
        + ([("--archive", Path(archive))] if archive is not None else []) \
        + ([("--report-dir", report)] if report is not None else [])
    check_writable_dir(plan.runs_dir, "the run directories (--runs-dir)")
    check_apart(places)
    if report is not None:
        check_writable_dir(report, "the report (--report-dir)")
        refuse_foreign(report, "report", "--report-dir")


def run_table3(plan: Table3Plan, workers: int = 1, devices: list[str] | None = None,
               devices_per_run: int = 1, heartbeat_s: int = 60, archive: str | None = None,
               stop_after_s: float | None = None, run_seconds: dict[str, float] | None = None) -> Table3Outcome:
    """Check the planned rows' data (one line, before anything is queued), queue every planned
    (row, seed) not complete, run the queue-only workers until it is empty (or interrupted), and
    print one line per planned run (`tables.make.make_table3` then writes the report).
    `archive`: where the runs are kept for a sitting on another machine (`tables.archive`).
    `stop_after_s`: stop the workers that long after they start, as if interrupted, starting only the
    runs expected to finish by then (`run_seconds`: `tables.cost.run_seconds`, `tables.policy.TablePolicy`)."""
    from tables import archive as kept

    if archive is not None:  # checked before anything is written (the data's cache included)
        folder = Path(archive)
        record = check_archive(folder, plan, identity(plan))
        check_writable_dir(folder, "the archive (--archive)")
        kept.check_study_file(folder)  # a damaged or oversized journal
        runs = plan.run_dirs()
        kept.check_owned(runs, folder)  # no link, nothing of another kind, in an entry or run directory
    corpus = check_data(plan)  # a corpus or length limit that leaves no pairs: one line here, not per trial
    inject("startup")
    if archive is None:
        return _run_queue(plan, queue(plan, corpus=corpus), workers, devices, devices_per_run, heartbeat_s,
                          stop_after_s, run_seconds)
    restored = kept.restore(runs, folder)
    if restored:
        print(f"table3 {plan.study}: restored from {folder}: {', '.join(restored)}", flush=True)
    storage = make_storage(plan.storage, None)
    study, queued = queue(plan, folder, storage, corpus)
    with kept.kept_in(runs, folder, record, (storage, plan.study)):
        return _run_queue(plan, (study, queued), workers, devices, devices_per_run, heartbeat_s, stop_after_s,
                          run_seconds)


def _run_queue(plan: Table3Plan, queued_now: tuple[optuna.Study, int], workers: int, devices: list[str] | None,
               devices_per_run: int, heartbeat_s: int, stop_after_s: float | None = None,
               run_seconds: dict[str, float] | None = None) -> Table3Outcome:
    from sweeps.launch import run_workers
    from tables.policy import NAME as TABLE_POLICY
    from sweeps.worker import WorkerSettings

    study, queued = queued_now
    print(f"table3 {plan.study}: {len(plan.rows)} rows x {plan.describe_seeds()}; {queued} queued now, "
          f"storage {safe_url(plan.storage)}", flush=True)
    code = 0
    if queued or study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
        finish_by = None if stop_after_s is None else time.time() + stop_after_s
        settings = WorkerSettings(study=plan.study, storage=plan.storage, space=None, n_trials=0,
                                  runs_dir=plan.runs_dir, recipe=plan.recipe, pruner="none", heartbeat_s=heartbeat_s,
                                  policy=TABLE_POLICY, policy_args={"runs_dir": plan.runs_dir, "finish_by": finish_by,
                                                                    "run_seconds": dict(run_seconds or {})})
        while True:
            left = None if finish_by is None else max(0.0, finish_by - time.time())
            # Every queued trial, whatever the study holds already: the workers stop when none waits.
            settings.n_trials = len(plan.runs()) + len(study.get_trials(deepcopy=False))
            code = run_workers(settings, workers, devices, devices_per_run, quiet=True, stop_after_s=left)
            if code == EXIT_INTERRUPTED:
                return Table3Outcome(code, [])
            if finish_by is not None and study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                print(f"table3 {plan.study}: this part (--stop-after) ends before the runs left could "
                      f"finish; run the same command again to go on", file=sys.stderr, flush=True)
                return Table3Outcome(EXIT_INTERRUPTED, [])
            if wait_for_others(study, plan, heartbeat_s):  # a run went back to the queue
                continue
            if plan.tuning is None or not queue_tuned(plan, study, make_storage(plan.storage, None), candidates=False):
                break  # nothing more to train (a tuned table: no row's other seeds at its chosen value)
    return Table3Outcome(code, print_summary(study, plan))


def running_elsewhere(study: optuna.Study, plan: Table3Plan) -> list[str]:
    """The planned runs whose latest trial is running, and a tuned table's tuned runs that are: by
    another launcher's workers, once ours have stopped (several launchers on one study share its queue)."""
    return [f"{row} seed {seed}" for (row, seed), trial in status(study, plan).items()
            if trial is not None and trial.state == TrialState.RUNNING] \
        + [f"{tuned_name(t.user_attrs['row'], t.user_attrs[TUNE])} seed {t.user_attrs['seed']}"
           for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if TUNE in t.user_attrs]


def wait_for_others(study: optuna.Study, plan: Table3Plan, heartbeat_s: int) -> bool:
    """Once this launcher's workers found the queue empty, wait while another launcher trains the
    table's last runs, so that every launcher ends when the table does, with its exit status and
    report (`test_table3.py`). A run whose launcher died goes back to the queue when its heartbeat
    stops (`fail_stale_trials`): then True, and the caller runs its workers again."""
    from sweeps.optuna_api import fail_stale_trials

    running = running_elsewhere(study, plan)
    if running:
        print(f"table3 {plan.study}: waiting for {', '.join(running)}, trained by another launcher", flush=True)
        # with the workers' heartbeat: a trial whose worker died (its heartbeat stopped) fails
        # and is queued again after the heartbeat's grace, whoever's worker it was
        study = optuna.load_study(study_name=study.study_name, storage=make_storage(plan.storage, heartbeat_s))
    while running:
        time.sleep(min(5.0, heartbeat_s / 4))
        fail_stale_trials(study)
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return True
        running = running_elsewhere(study, plan)
    return False
