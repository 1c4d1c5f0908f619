"""Where a table stands (`ablate table3 --dry-run` on a table that has run): which runs are finished,
how far the unfinished ones got, and the device-hours left, by the preset's measured rate and by
the rate this table's runs actually trained at (other work on the device, another machine,
long-run effects that a short benchmark misses), over all of them and row by row: a finished
run's tokens per training second, and for a run under way the median of its logged windows'
`train/tokens_per_s`, so a first sitting shows its own rate before any run has finished.

Read only, from what a sitting would see: the run directories under `--runs-dir`, the `--archive`
(a run there counts as restored) and the study where its storage exists (a run finished on another
machine counts). An unfinished run's progress is its last logged training step (`logs/metrics.csv`);
it resumes from its newest checkpoint, up to one checkpoint interval earlier: a slight under-estimate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from foundation.errors import UserError
from lightning_modules.metrics_log import last_step, logged
from lightning_modules.run.results import read_results
from tables import archive as kept
from tables.cost import DeviceRate, TimeUnit, estimate
from tables.redo import redo_requests
from tables.plan import Table3Plan, check_archive, check_study, identity, run_dir, status
from tables.policy import own_or_overall


@dataclass(frozen=True)
class RunProgress:
    """One planned (row, seed): finished, failed (a NaN loss: it stays failed), or the last
    training step it logged."""

    row: str
    seed: int
    finished: bool
    step: int
    max_steps: int
    tokens_per_s: float | None = None  # target tokens per training second, as measured (below)
    failed: bool = False

    @property
    def fraction(self) -> float:
        """The part of its training behind it (a failed run has none ahead)."""
        return 1.0 if self.finished or self.failed else min(self.step / self.max_steps, 1.0)

    @property
    def under_way(self) -> bool:
        return not self.finished and not self.failed and self.step > 0


MIN_WINDOWS = 3  # a rate from fewer logged windows is mostly start-up and compilation


def window_rate(log_dir: Path) -> float | None:
    """The median `train/tokens_per_s` of a run's logged windows, every attempt joined (the
    median passes over the few windows that held a compilation); None for fewer than
    MIN_WINDOWS windows, or logs written before the rate was logged."""
    rates = pd.Series(list(logged(log_dir, "train/tokens_per_s").values()), dtype=float)
    return float(rates.median()) if len(rates) >= MIN_WINDOWS else None


def finished_in_study(plan: Table3Plan, wanted: dict[str, Any]) -> tuple[set[tuple[str, int]], set[tuple[str, int]],
                                                                         str | None]:
    """The planned runs the study holds as complete, those of them the plan's `--redo` would train
    again, and why the study was not read (or None).
    Opens only a storage that exists (a dry run creates nothing); a study of another table is
    refused as the table itself refuses it (`table3.check_study`; `wanted`: `table3.identity`)."""
    from sweeps.storage import journal_path, make_storage, sqlite_path

    local = sqlite_path(plan.storage) or journal_path(plan.storage)
    if local is not None and not local.is_file():
        return set(), set(), None  # no table has run with this storage here
    try:
        study = optuna.load_study(study_name=plan.study, storage=make_storage(plan.storage, None, read_only=True))
    except UserError as err:
        return set(), set(), str(err)
    except KeyError:
        return set(), set(), None
    check_study(study, plan, wanted, record=False)
    latest = status(study, plan)
    done = {key for key, trial in latest.items() if trial is not None and trial.state == TrialState.COMPLETE}
    again = set(redo_requests(study, [key for key in latest if key[0] in plan.redo], latest))
    return done - again, again, None


def progress(plan: Table3Plan, max_steps: dict[str, int], archive: str | None = None,
             in_study: set[tuple[str, int]] = frozenset(),
             again: set[tuple[str, int]] = frozenset()) -> list[RunProgress]:
    """Every planned run's progress, from its run directory, the archive and the study (`again`:
    finished runs a redo would train from the start)."""
    found = []
    for row, seed in plan.runs():
        if (row, seed) in again:
            found.append(RunProgress(row, seed, False, 0, max_steps[row]))
            continue
        places = [Path(run_dir(plan, row, seed))]
        if archive is not None:
            places.append(kept.entry(Path(archive), row, seed))
        written = [r for r in map(read_results, places) if r is not None]
        results = next((r for r in written if r.complete), None)
        done = (row, seed) in in_study or results is not None
        steps = {place: last_step(place / "logs") for place in places}
        step = max(steps.values())
        measured = results.tokens_per_s if results is not None else None
        if not done and not written:  # under way: its logged windows (the furthest copy's)
            measured = window_rate(max(steps, key=steps.__getitem__) / "logs")
        found.append(RunProgress(row, seed, done, step, max_steps[row], measured,
                                 failed=not done and bool(written)))
    return found


def shares(runs: list[RunProgress], params: pd.Series, rate: DeviceRate, workers: int) -> pd.Series:
    """How fast each of this table's runs trained (finished, or under way with enough logged
    windows), as a share of the preset's rate: parameters x target tokens/s against base's at the
    preset's rate split over `workers`, indexed by row (empty without a run that measured it)."""
    expected = params["base"] * rate.base_tokens_per_s / workers
    done = [run for run in runs if run.tokens_per_s]  # a failed run has none
    return pd.Series([params[run.row] * run.tokens_per_s / expected for run in done],
                     index=[run.row for run in done], dtype=float)


def left_at_own_rate(left: pd.Series, found: pd.Series) -> float:
    """Device time left (`left`: per row, at the preset's rate, in any unit) at each row's own
    measured share (`found`, indexed by row; `tables.policy.own_or_overall`)."""
    share = own_or_overall(found.items())
    return float(sum(time / share(row) for row, time in left.items()))


def describe(runs: list[RunProgress], table: pd.DataFrame, rate: DeviceRate, workers: int,
             unread: str | None = None) -> str | None:
    """Per row: runs finished of planned and device time left; then the totals, the runs under
    way and the rate this table's runs trained at, in the estimate's unit (minutes for a table of
    under an hour). None if nothing has started and the study was read."""
    if not any(run.finished or run.failed or run.under_way for run in runs):
        return (f"where the table stands: not known here; the study was not read ({unread}), and no run "
                f"directory here holds a run of it" if unread else None)
    unit = TimeUnit.of(table)
    per_run, left_col = table["hours/run"] * unit.per_hour, f"{unit.short} left"
    frame = pd.DataFrame([{"row": run.row, "finished": int(run.finished),
                           "left": (1.0 - run.fraction) * per_run[run.row]} for run in runs])
    rows = frame.groupby("row", sort=False).agg(planned=("finished", "size"), finished=("finished", "sum"),
                                                 left=("left", "sum")).rename(columns={"left": left_col})
    left = float(rows[left_col].sum())
    under_way = [run for run in runs if run.under_way]
    going = "; ".join(f"{run.row} seed {run.seed} at step {run.step:,} of {run.max_steps:,}" for run in under_way)
    longest = max((run for run in runs if run.fraction < 1.0),
                  key=lambda run: (1.0 - run.fraction) * per_run[run.row], default=None)
    failed = [f"{run.row} seed {run.seed}" for run in runs if run.failed]
    text = (f"where the table stands:\n{rows.to_string(formatters={left_col: '{:.2f}'.format})}\n\n"
            f"{int(rows['finished'].sum())} of {len(runs)} runs finished"
            + (f", {len(under_way)} under way ({going})" if under_way else "")
            + (f", {len(failed)} failed and left failed ({', '.join(failed)})" if failed else "")
            + f"; about {left:.1f} device-{unit.name} left by the rate above")
    if longest is not None:
        text += (f" (the longest run left, {longest.row} seed {longest.seed}, "
                 f"{(1.0 - longest.fraction) * per_run[longest.row]:.1f})")
    text += ". An unfinished run counts from its last logged step."
    found = shares(runs, table["params"], rate, workers)
    if len(found) and left > 0:
        share = float(found.median())
        runs_word, workers_word = "run" + "s" * (len(found) != 1), "worker" + "s" * (workers != 1)
        text += (f"\nThis table's runs trained at {share:.0%} of that rate (median over {len(found)} "
                 f"{runs_word}, finished or under way, with {workers} {workers_word} sharing the "
                 f"device): at their rate, "
                 f"about {left / share:.1f} device-{unit.name} left; at each row's own rate (the median "
                 f"elsewhere), about {left_at_own_rate(rows[left_col], found):.1f}.")
    if unread:
        text += f"\n(the study was not read: {unread}; runs finished elsewhere are not counted)"
    return text


def standing(plan: Table3Plan, archive: str | None = None, workers: int = 1) -> str | None:
    """The dry run's second part: where the planned table stands (None if nothing has started)."""
    wanted = identity(plan)
    if archive is not None:
        check_archive(Path(archive), plan, wanted)
    in_study, again, unread = finished_in_study(plan, wanted)
    table, rate = estimate(plan)
    runs = progress(plan, table["steps"].to_dict(), archive, in_study, again)
    return describe(runs, table, rate, workers, unread)
