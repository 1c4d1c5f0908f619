"""Table 3 as a queue: every (row, seed) not yet complete becomes a queued trial of one study.

The sweep workers (`sweeps.worker`, queue-only) take the trials, so Table 3 runs on one CPU, on
the GPUs of one machine, or on many machines sharing a PostgreSQL study, like any sweep.
Each (row, seed) trains in `<runs_dir>/<study>/<row>-s<seed>`; a re-run queues only what is not
complete, and a killed trial resumes there from its checkpoint.

The study remembers what it is a table of (preset, spec rows, fixed overrides) in its user
attributes, so the report needs nothing but the database, and a re-run with different settings
is refused instead of mixing two tables.
"""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from ablations.resolve import parse_overrides, resolve
from ablations.spec import default_rows, default_seeds, load_spec, one_seed_rows
from lightning_modules.config import TOKENIZER_KEYS, check_seed, count_parameters
from lightning_modules.errors import EXIT_INTERRUPTED, UserError
from lightning_modules.run.faults import inject
from lightning_modules.run.io import check_writable_dir
from lightning_modules.run.results import read_results
from sweeps.redo import ARCHIVED_AS, REDO_OF, aside, redo_requests, redone_before, set_aside_copies, superseded
from sweeps.storage import make_storage, safe_url
from sweeps.study import enqueue, open_study, translation_attrs

KIND = "table3"


@dataclass
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
    redo: list[str] = field(default_factory=list)  # rows whose finished runs train again (`sweeps.redo`)

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
              config: str | None = None, every_seed: bool = False, redo: str | None = None) -> Table3Plan:
    """The plan of `ablate table3`: rows (`base,A,D3`; default: the preset's, else the spec's),
    seeds (`1,2`; default: the preset's `table3.seeds`, else the resolved train.seed; rows the
    preset's one-seed rule names get the first only, unless `every_seed`), study name (default
    `table3-PRESET`), rows to redo (`base,C5`: rows or groups of the table)."""
    from lightning_modules.run.preflight import check_hardware  # loads torch: not for the report's imports

    spec = load_spec(spec_path)
    chosen = select_rows(rows, spec, default_rows(preset) if spec_path is None else None)
    base = resolve(preset, "base", config, overrides, spec_path)
    check_hardware(base)
    check_writable_dir(runs_dir, "the run directories (--runs-dir)")
    seed_list = parse_seeds(seeds, default_seeds(preset) or [base.train.seed])
    single = [] if every_seed else [row for row in one_seed_rows(preset, spec) if row in chosen]
    again = [] if redo is None else select_rows(redo, spec, None, with_base=False, option="--redo")
    if outside := [row for row in again if row not in chosen]:
        raise UserError(f"--redo names rows the table does not run ({', '.join(outside)}); "
                        f"its rows: {', '.join(chosen)}")
    return Table3Plan(study=study or f"table3-{preset}", storage=storage, preset=preset, rows=chosen,
                      seeds=seed_list, runs_dir=runs_dir, overrides=overrides, spec_path=spec_path,
                      config=config, one_seed_rows=single, redo=again)


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
            close = difflib.get_close_matches(item, [*spec, *groups], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserError(f"unknown Table 3 row or group {item!r}{hint}; rows: {', '.join(spec)}")
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


def check_data(plan: Table3Plan) -> None:
    """Prepare each distinct data setting of the planned rows once, in a scratch directory (see
    `preflight.check_data`): a table whose data leaves no pairs fails in one line before anything
    is queued, instead of in every trial."""
    from lightning_modules.run.preflight import check_data as prepare  # loads the data stack

    seen = set()
    for row in plan.rows:
        cfg = resolve(plan.preset, row, plan.config, plan.overrides, plan.spec_path)
        key = repr((cfg.data, cfg.model.max_len))
        if key not in seen:
            seen.add(key)
            prepare(cfg)


def run_place(plan: Table3Plan, row: str, seed: int) -> str:
    """A (row, seed)'s run directory relative to the runs directory, as its trials store it."""
    return f"{plan.study}/{row}-s{seed}"


def run_dir(plan: Table3Plan, row: str, seed: int) -> str:
    """A (row, seed)'s run directory on this machine."""
    return str((Path(plan.runs_dir) / run_place(plan, row, seed)).resolve())


# What a preset's training recipe is (base row, resolved): a preset file edited between two
# sittings of one table would otherwise train its remaining rows differently without a word.
# Paths, devices, logging and checkpoint cadence are not the recipe; a row's own changes are in
# the spec; corpus, vocabulary, batch tokens, beam and length penalty are in `setup` already.
RECIPE_KEYS = {
    "train": ("max_steps", "warmup_steps", "lr_scale", "lr_decay", "adam_beta1", "adam_beta2",
              "adam_eps", "accumulate_grad_batches", "gradient_clip_val"),
    "data": ("src_lang", "tgt_lang", "ding_dictionary", "valid_size", "test_size",
             "spm_input_sentence_size", "max_train_len", "train_pairs", "pad_multiple"),
    "eval": ("max_len_offset",),
}
# Identity keys added after tables were first stored: an older study lacking one records it at
# its next sitting (with a notice) instead of refusing.
ADDED_LATER = ("recipe",)


def identity(plan: Table3Plan, spec: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs of the command the same table (stored on the study)."""
    cfg = resolve(plan.preset, "base", plan.config, plan.overrides, plan.spec_path)
    setup = {"scale": asdict(cfg.scale), "corpus": cfg.data.corpus, "vocab_size": cfg.data.vocab_size,
             "max_tokens": cfg.data.max_tokens, "beam_size": cfg.eval.beam_size,
             "length_penalty": cfg.eval.length_penalty}
    recipe = {part: {key: getattr(getattr(cfg, part), key) for key in keys}
              for part, keys in RECIPE_KEYS.items()}
    recipe["model"] = {key: value for key, value in cfg.model.requested().items()
                       if key not in TOKENIZER_KEYS}
    return {"kind": KIND, "preset": plan.preset, "spec": spec, "overrides": plan.overrides,
            "config": plan.config, "setup": setup, "recipe": recipe}


def describe_differences(there: Any, here: Any) -> str:
    """`a.b: 1 -> 2; c: ...` for two identities (nested dicts), or the two values."""
    both_dicts = isinstance(there, dict) and isinstance(here, dict)
    return "; ".join(_differences(there, here)) if both_dicts else f"{there!r} -> {here!r}"


def _differences(there: Any, here: Any, prefix: str = "") -> list[str]:
    """`key: there -> here` for each leaf where two nested dicts differ."""
    if isinstance(there, dict) and isinstance(here, dict):
        return [line for key in sorted(set(there) | set(here), key=str)
                for line in _differences(there.get(key), here.get(key), f"{prefix}{key}.")]
    return [] if there == here else [f"{prefix.rstrip('.')}: {there!r} -> {here!r}"]


def check_study(study: optuna.Study, wanted: dict[str, Any]) -> None:
    """Store the table's identity on a new study; refuse to add a different table to an old one."""
    attrs = study.user_attrs
    if "kind" not in attrs:
        if study.get_trials(deepcopy=False):
            raise UserError(f"study {study.study_name!r} holds a sweep, not a Table 3: use another --study")
        for key, value in wanted.items():
            study.set_user_attr(key, value)
        return
    for key in ADDED_LATER:
        if key in wanted and key not in attrs:
            print(f"table3 {study.study_name}: this study predates the {key} check; recording "
                  f"this command's {key} for its later sittings", file=sys.stderr, flush=True)
            study.set_user_attr(key, wanted[key])
            attrs = {**attrs, key: wanted[key]}
    refusal = other_table(study.study_name, attrs, wanted)
    if refusal is not None:
        raise refusal


# Overrides that choose only where a run's output goes, not what it computes: one sitting may run
# with `--no-wandb` and the next with W&B, and it is still the same table.
OUTPUT_ONLY = {"train": ("wandb", "progress_bar")}


def comparable(identity: Any) -> Any:
    """A table's identity as two sittings compare it: its overrides as the settings they make (of
    two for one key the later wins, so their order is not the table; `d_model` is `model.d_model`),
    less those that only choose where output goes. Overrides this version cannot read (a key
    since renamed) are compared as written."""
    if not isinstance(identity, dict):
        return identity
    try:
        settings = parse_overrides([str(item) for item in identity.get("overrides") or []])
    except UserError:
        return identity
    for section, keys in OUTPUT_ONLY.items():
        kept = {key: value for key, value in settings.pop(section, {}).items() if key not in keys}
        if kept:
            settings[section] = kept
    return {**identity, "overrides": settings}


def other_table(name: str, attrs: dict[str, Any], wanted: dict[str, Any]) -> UserError | None:
    """Why a stored Table 3 (its user attributes) is not the table `wanted`, or None if it is."""
    attrs, wanted = comparable(attrs), comparable(wanted)
    for key, value in wanted.items():
        there = attrs.get(key)
        if there == value:
            continue
        changed = describe_differences(there, value)
        what = {"spec": "rows of the ablation spec", "recipe": "training recipe"}.get(key, key)
        return UserError(f"study {name!r} is a Table 3 that differs in its {what} ({changed}; "
                         f"there -> here): the runs still queued would not be comparable to those "
                         f"done. Use another --study")
    return None


def finished(run_dir: Path) -> bool:
    """Whether a run directory holds a complete results.json (the workers adopt it as it is)."""
    done = read_results(run_dir)
    return done is not None and done.complete


def queue(plan: Table3Plan, archive: Path | None = None) -> tuple[optuna.Study, int]:
    """Validate every (row, seed), then queue those not complete, costliest first, and the redos
    the plan asks for (`sweeps.redo`; `archive`: the table's --archive, whose entries of redone
    runs are set aside too). Returns the study and the number queued now."""
    spec = load_spec(plan.spec_path)
    jobs = []
    for row, seed in plan.runs():
        overrides = seed_overrides(seed)
        cfg = resolve(plan.preset, row, plan.config, [*plan.overrides, *overrides], plan.spec_path)
        model = cfg.model.with_vocabulary(cfg.data.vocab_size, cfg.model.pad_id)  # about right
        cost = count_parameters(model) * cfg.train.max_steps  # for ordering by cost
        jobs.append((cost, row, seed, overrides))
    study = open_study(plan.study, make_storage(plan.storage, None), "ppl")
    check_study(study, identity(plan, spec))
    replaced = restore_history(plan, study, spec, archive) if archive is not None else {}
    redone = redo(plan, study, spec, archive)
    # Longest first: the big model starts at once instead of last, which shortens the table;
    # finished run directories the study does not know yet (restored, copied in) go before
    # everything: adopted in seconds, they are in the study from the start.
    done = {(row, seed): finished(Path(run_dir(plan, row, seed))) for row, seed in plan.runs()}
    queued = 0
    for _, row, seed, overrides in sorted(jobs, key=lambda j: (not done[j[1], j[2]], -j[0])):
        attrs = trial_attrs(plan, spec, row, seed)
        if (row, seed) in replaced:
            attrs[REDO_OF] = replaced[row, seed]
        queued += enqueue(study, overrides, attrs)
    return study, queued + redone


def seed_overrides(seed: int) -> list[str]:
    """What a queued (row, seed) trial changes in its row's configuration (`enqueue` matches on it)."""
    return [f"train.seed={seed}"]


def trial_attrs(plan: Table3Plan, spec: dict[str, Any], row: str, seed: int) -> dict[str, Any]:
    """What a queued (row, seed) trial carries: the report and the workers read these."""
    return {"row": row, "seed": seed, "group": spec[row].get("group", row), "run_dir": run_place(plan, row, seed)}


def restore_history(plan: Table3Plan, study: optuna.Study, spec: dict[str, Any],
                    archive: Path) -> dict[tuple[str, int], int]:
    """Bring back into a study the runs the table's redos replaced, from their copies set aside in
    `archive` (`sweeps.redo`), for each planned (row, seed) the study holds no trial of (a study
    made afresh: on the machine whose study set them aside, they are in it already). Each complete
    copy becomes a complete trial (`archived_as` its folder; oldest first, each naming the one
    before as the trial it replaced), so the report names them as that study did. Returns the
    trial each (row, seed)'s own run replaces: `queue` gives it as the run's `redo_of`."""
    from optuna.trial import create_trial

    from sweeps.archive import entry

    held = {(t.user_attrs.get("row"), t.user_attrs.get("seed")) for t in study.get_trials(deepcopy=False)}
    replaced: dict[tuple[str, int], int] = {}
    for row, seed in plan.runs():
        if (row, seed) in held:
            continue
        for place in set_aside_copies(entry(archive, row, seed)):
            done = read_results(place)
            if done is None or not done.complete or done.ppl is None:
                continue
            attrs = {**trial_attrs(plan, spec, row, seed), **done.select("trial"),
                     **(translation_attrs(place) or {}), "enqueued_overrides": seed_overrides(seed),
                     ARCHIVED_AS: place.name}
            del attrs["run_dir"]  # not trained here: its files are in the archive, under its name
            if (row, seed) in replaced:
                attrs[REDO_OF] = replaced[row, seed]
            study.add_trial(create_trial(state=TrialState.COMPLETE, value=float(done.ppl), user_attrs=attrs))
            replaced[row, seed] = max(t.number for t in study.get_trials(deepcopy=False)
                                      if t.user_attrs.get(ARCHIVED_AS) == place.name
                                      and (t.user_attrs.get("row"), t.user_attrs.get("seed")) == (row, seed))
        if (row, seed) in replaced:
            print(f"table3 {plan.study}: {row} seed {seed}: the run a redo replaced is back in the study from "
                  f"{archive} (trial {replaced[row, seed]})", flush=True)
    return replaced


def redo(plan: Table3Plan, study: optuna.Study, spec: dict[str, Any], archive: Path | None) -> int:
    """Queue the plan's redos not yet asked for: each old run's directory and archive entry set
    aside first (a sitting stopped in between asks again), then its trial. Returns how many."""
    from sweeps.archive import entry

    wanted = [(row, seed) for row, seed in plan.runs() if row in plan.redo]
    requests = redo_requests(study, wanted, status(study, plan))
    asked = 0
    for (row, seed), number in requests.items():
        places = [Path(run_dir(plan, row, seed))] + ([entry(archive, row, seed)] if archive else [])
        if (shown := redone_before(places)) is not None:  # a study made afresh beside the archive
            print(f"table3 {plan.study}: {row} seed {seed} was redone before ({shown} is the redo, beside the "
                  f"run it replaced); not trained again", flush=True)
            continue
        asked += 1
        moved = [str(target) for target in (aside(place, number) for place in places) if target]
        enqueue(study, seed_overrides(seed), {**trial_attrs(plan, spec, row, seed), REDO_OF: number})
        print(f"table3 {plan.study}: {row} seed {seed} trains again (replacing trial {number}"
              + (f"; its run kept in {', '.join(moved)}" if moved else "") + ")", flush=True)
    return asked


def status(study: optuna.Study, plan: Table3Plan) -> dict[tuple[str, int], optuna.trial.FrozenTrial | None]:
    """The latest trial of each planned (row, seed), or None."""
    latest: dict[tuple[str, int], optuna.trial.FrozenTrial] = {}
    trials = study.get_trials(deepcopy=False)
    replaced = superseded(trials)
    for trial in trials:
        if trial.user_attrs.get("nothing_queued") or trial.number in replaced:  # never ran, or redone
            continue
        key = (trial.user_attrs.get("row"), trial.user_attrs.get("seed"))
        if key in latest and latest[key].state == TrialState.COMPLETE:
            continue
        latest[key] = trial
    return {(row, seed): latest.get((row, seed)) for row, seed in plan.runs()}


def summary(study: optuna.Study, plan: Table3Plan) -> tuple[str, list[str]]:
    """A short text table of the planned runs, and the ones not complete."""
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
    return "\n".join(lines), missing


def print_summary(study: optuna.Study, plan: Table3Plan) -> list[str]:
    text, missing = summary(study, plan)
    print(text, flush=True)
    if missing:
        print(f"table3: not complete: {', '.join(missing)}; see each run directory's trial.log, "
              f"and run the same command again to resume", file=sys.stderr)
    return missing


@dataclass
class Table3Outcome:
    """How a Table 3 run ended: the workers' exit status and the (row, seed) runs not complete."""

    workers_status: int
    missing: list[str]

    @property
    def interrupted(self) -> bool:
        return self.workers_status == EXIT_INTERRUPTED

    @property
    def exit_status(self) -> int:
        """0 when every planned run is complete and every worker ended cleanly, 130 interrupted, else 1."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        return 1 if self.missing or self.workers_status else 0


def check_archive(archive: Path, wanted: dict[str, Any]) -> None:
    """Refuse an `--archive` of another table (see `sweeps.archive`)."""
    from sweeps.archive import stored_identity

    stored = stored_identity(archive)
    if stored is None:
        return
    there, here = comparable(stored), comparable(json.loads(json.dumps(wanted)))  # tuples as lists, as stored
    if there != here:
        raise UserError(f"--archive {archive} holds another table ({describe_differences(there, here)}; "
                        f"there -> here): use another --archive")


def run_table3(plan: Table3Plan, workers: int = 1, devices: list[str] | None = None,
               devices_per_trial: int = 1, heartbeat_s: int = 60, archive: str | None = None,
               stop_after_s: float | None = None) -> Table3Outcome:
    """Queue every planned (row, seed) not complete, run the queue-only workers until it is empty
    (or they are interrupted), and print one line per planned run. The report is the caller's
    (`reports.build.build_report`), from the database.

    `archive`: a folder that keeps the runs for a sitting on another machine (`sweeps.archive`):
    restored from before the queue is made, saved to while the workers run and when they end.
    `stop_after_s`: stop the workers that long after they start, as if interrupted."""
    from sweeps import archive as kept

    inject("startup")
    if archive is None:
        return _run_queue(plan, workers, devices, devices_per_trial, heartbeat_s, stop_after_s)
    folder, wanted = Path(archive), identity(plan, load_spec(plan.spec_path))
    check_archive(folder, wanted)
    check_writable_dir(folder, "the archive (--archive)")
    runs = {(row, seed): Path(run_dir(plan, row, seed)) for row, seed in plan.runs()}
    restored = kept.restore(runs, folder)
    if restored:
        print(f"table3 {plan.study}: restored from {folder}: {', '.join(restored)}", flush=True)
    with kept.kept_in(runs, folder, wanted):
        return _run_queue(plan, workers, devices, devices_per_trial, heartbeat_s, stop_after_s, folder)


def _run_queue(plan: Table3Plan, workers: int, devices: list[str] | None, devices_per_trial: int,
               heartbeat_s: int, stop_after_s: float | None = None, archive: Path | None = None) -> Table3Outcome:
    from sweeps.launch import run_workers
    from sweeps.worker import WorkerSettings

    study, queued = queue(plan, archive)
    print(f"table3 {plan.study}: {len(plan.rows)} rows x {plan.describe_seeds()}; {queued} queued now, "
          f"storage {safe_url(plan.storage)}", flush=True)
    code = 0
    if queued or study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
        # Every queued trial, whatever the study holds already: the workers stop when none waits.
        n_trials = len(plan.runs()) + len(study.get_trials(deepcopy=False))
        settings = WorkerSettings(study=plan.study, storage=plan.storage, space=None, n_trials=n_trials,
                                  runs_dir=plan.runs_dir, preset=plan.preset, config=plan.config,
                                  spec=plan.spec_path, overrides=plan.overrides, pruner="none",
                                  heartbeat_s=heartbeat_s, queue_only=True, keep_translations=True)
        code = run_workers(settings, workers, devices, devices_per_trial, quiet=True, stop_after_s=stop_after_s)
        if code == EXIT_INTERRUPTED:
            return Table3Outcome(code, [])
    return Table3Outcome(code, print_summary(study, plan))
