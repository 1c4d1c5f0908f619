"""`ablate table3 --redo ROWS`: train finished runs of a table again, keeping the ones they replace.

A finished run can need training again: it was trained before runs kept their dev translations
(the report's paired bootstrap needs them), or under code that has changed since. A finished
trial cannot be changed through Optuna's public API, and nothing a user ran may be lost, so a
redo adds: for each planned (row, seed) of ROWS whose run the study holds as complete, the
table moves the old run's archive entry, then its run directory, aside to
`<row>-s<seed>.superseded-t<number>` (`number`: the old trial's), then queues a new trial with
`redo_of` = that number. The old trial stays in the study; the report takes the newest complete
trial of each (row, seed) and names the runs it replaced, with their numbers and folders.

Each run is redone once: a (row, seed) that already has a redo trial, in any state, is left to
the queue, so the same command resumes an interrupted redo instead of starting it again. A
sitting stopped between the moves leaves no folder to set aside twice: the archive entry goes
first, so the run directory the next sitting finds is still the old run (not one restored from
the archive over a moved one). The history travels with the table's archive: the archive keeps
the whole study (`tables.archive`, `study.journal.xz`), and a study made afresh beside it is that
study, trial numbers and `redo_of` included, so the report names the same redos on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from foundation.errors import UserError
from ablations.record import aside_name
from sweeps.study import REDO_OF


def aside(path: Path, number: int) -> Path | None:
    """Move a run directory or archive entry to `<name>.superseded-t<number>`, returning where it
    went; None if there is nothing at `path`. A name taken already is refused, never written over
    (a redo sets each trial's run aside once: `tables.plan.redo`)."""
    if not path.exists():
        return None
    target = path.with_name(aside_name(path.name, number))
    if target.exists():
        raise UserError(f"{target} exists already, so {path} cannot be set aside there; move one of them "
                        f"elsewhere and run the same command again")
    path.rename(target)
    return target


def redo_requests(study: optuna.Study, keys: Iterable[tuple[str, int]],
                  latest: dict[tuple[str, int], optuna.trial.FrozenTrial | None]) -> dict[tuple[str, int], int]:
    """For each (row, seed) in `keys` not yet redone, the number of its complete trial to replace
    (`latest`: the current trial of each planned (row, seed), as `tables.plan.status` gives)."""
    asked = {(t.user_attrs.get("row"), t.user_attrs.get("seed"))
             for t in study.get_trials(deepcopy=False) if t.user_attrs.get(REDO_OF) is not None}
    out = {}
    for key in keys:
        trial = latest.get(key)
        if key not in asked and trial is not None and trial.state == TrialState.COMPLETE:
            out[key] = trial.number
    return out
