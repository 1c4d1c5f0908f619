"""`ablate table3 --redo ROWS`: train finished runs of a table again, keeping the ones they replace.

A finished run can need training again: it was trained before runs kept their dev translations
(the report's paired bootstrap needs them), or under code that has changed since. A finished
trial cannot be changed through Optuna's public API, and nothing a user ran may be lost, so a
redo adds: for each planned (row, seed) of ROWS whose run the study holds as complete, the
table queues a new trial with `redo_of` = the old trial's number, after moving the old run's
directory, and its archive entry, aside to `<row>-s<seed>.superseded-t<number>`. The old trial
stays in the study; the report takes the newest complete trial of each (row, seed) and names the
runs it replaced, with their numbers.

Each run is redone once: a (row, seed) that already has a redo trial, in any state, is left to
the queue, so the same command resumes an interrupted redo instead of starting it again. A study
made afresh beside the table's archive (a sitting on a new machine) learns the table's redos from
the archive: each complete copy set aside there comes back as a complete trial marked
`archived_as` (`sweeps.table3.restore_history`), and the run that replaced it is queued with
`redo_of` naming it, so the report names the runs a redo replaced on any machine. A run whose
archive entry or run directory is complete beside such a copy counts as redone too
(`redone_before`).
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from lightning_modules.run.results import read_results
from sweeps.archive import entry

REDO_OF = "redo_of"  # trial user attribute: the number of the complete trial this one replaces
# trial user attribute of a run a redo set aside, brought back from the archive into a study made
# afresh: the name of its set-aside folder (`<row>-s<seed>.superseded-t<N>`, N its number in the
# study that set it aside)
ARCHIVED_AS = "archived_as"


def superseded(trials: Iterable[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of the trials a redo replaces (whether or not the redo has finished), and of
    the replaced runs brought back from an archive (each was set aside by a redo)."""
    trials = list(trials)
    return ({int(t.user_attrs[REDO_OF]) for t in trials if t.user_attrs.get(REDO_OF) is not None}
            | {t.number for t in trials if t.user_attrs.get(ARCHIVED_AS) is not None})


def kept_as(trial: optuna.trial.FrozenTrial) -> str:
    """The folder name a redo set trial's run aside under (`aside`)."""
    attrs = trial.user_attrs
    return attrs.get(ARCHIVED_AS) or _aside_name(entry(Path(), attrs.get("row"), attrs.get("seed")), trial.number, 1).name


def _aside_name(path: Path, number: int, k: int) -> Path:
    return path.with_name(f"{path.name}.superseded-t{number}" + (f".{k}" if k > 1 else ""))


def aside(path: Path, number: int) -> Path | None:
    """Move a run directory or archive entry to `<name>.superseded-t<number>` (the first free
    name), returning where it went; None if there is nothing at `path`."""
    if not path.exists():
        return None
    k = 1
    while _aside_name(path, number, k).exists():  # a folder set aside before, then restored: keep both
        k += 1
    path.rename(target := _aside_name(path, number, k))
    return target


def set_aside_copies(path: Path) -> list[Path]:
    """Every copy of `path` a redo set aside, whatever trial it was (oldest first: a redo's trial
    has a higher number than the trial it replaces)."""
    pattern = re.compile(re.escape(path.name) + r"\.superseded-t(\d+)(?:\.(\d+))?")
    found = []
    for place in path.parent.glob(f"{glob.escape(path.name)}.superseded-t*"):
        if match := pattern.fullmatch(place.name):
            found.append(((int(match[1]), int(match[2] or 1)), place))
    return [place for _, place in sorted(found)]


def set_aside(path: Path, number: int) -> list[Path]:
    """Where `aside` put trial `number`'s copies of `path`, oldest first."""
    out, k = [], 1
    while (place := _aside_name(path, number, k)).exists():
        out.append(place)
        k += 1
    return out


def redone_before(places: Iterable[Path]) -> Path | None:
    """The place (a run directory or archive entry) that shows its run was redone already: a
    complete run beside a copy a redo set aside of another run (not of itself: a sitting stopped
    between a redo's two moves may have restored the old run from the archive); None if none does."""
    for place in places:
        done = read_results(place)
        if done is None or not done.complete:
            continue
        if any(read_results(old) != done for old in set_aside_copies(place)):
            return place
    return None


def redo_requests(study: optuna.Study, keys: Iterable[tuple[str, int]],
                  latest: dict[tuple[str, int], optuna.trial.FrozenTrial | None]) -> dict[tuple[str, int], int]:
    """For each (row, seed) in `keys` not yet redone, the number of its complete trial to replace
    (`latest`: the current trial of each planned (row, seed), as `sweeps.table3.status` gives)."""
    asked = {(t.user_attrs.get("row"), t.user_attrs.get("seed"))
             for t in study.get_trials(deepcopy=False) if t.user_attrs.get(REDO_OF) is not None}
    out = {}
    for key in keys:
        trial = latest.get(key)
        if key not in asked and trial is not None and trial.state == TrialState.COMPLETE:
            out[key] = trial.number
    return out
