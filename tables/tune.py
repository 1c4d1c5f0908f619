"""`ablate table3 --tune KEY=V1,V2,...`: every row, base included, at its own best value of a
training setting, beside the table at the preset's value (the protocol: docs/table3.md, "Tuned
ablations"). What `--tune` asks for (`Tuning`), a row's candidates and its decision once they have
all ended (`decide`); the queue that trains them is the table's (`tables.plan.queue_tuned`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from ablations.record import TUNE, TUNED, TunedCandidate, TunedRow, setting_label
from ablations.resolve import Resolver, parse_overrides
from ablations.spec import ROW_REFUSED
from foundation.errors import UserError
from lightning_modules.config import RunConfig

MAX_CANDIDATES = 32  # settings a row tries, at most (a grid of every --tune's values)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)  # a candidate's trial that has ended


@dataclass(frozen=True)
class Tuning:
    """What `--tune` asks for: each tuned key's values as listed, typed (a grid when several keys),
    and the first rung's share of a row's steps (`--tune-budget`; None: its first dev evaluation)."""

    values: dict[str, tuple[Any, ...]]
    budget: float | None = None

    def own(self, cfg: RunConfig) -> dict[str, Any]:
        """The row's value of each tuned key, as its untuned run trains (`cfg`)."""
        return {key: value_of(cfg, key) for key in self.values}

    def candidates(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        """The settings a row tries: its own first, then the grid's others in the order listed."""
        grid = [dict(zip(self.values, combo)) for combo in itertools.product(*self.values.values())]
        return [own, *(setting for setting in grid if setting != own)]

    def first_rung(self, cfg: RunConfig) -> int:
        """The step at which a row's candidates first compete: its first dev evaluation at or after
        the budget's share of its steps (the halving's minimum resource: its later rungs are 3, 9, ...
        times it, each a dev evaluation too)."""
        every = cfg.train.val_check_interval
        wanted = every if self.budget is None else max(1, round(self.budget * cfg.train.max_steps))
        return math.ceil(wanted / every) * every

    def record(self, seed: int) -> dict[str, Any]:
        """What the study keeps of its tuning (a later sitting may not tune otherwise)."""
        return {"values": {key: list(values) for key, values in self.values.items()}, "seed": seed,
                "budget": self.budget}


def value_of(cfg: RunConfig, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def overrides(seed: int, setting: dict[str, Any]) -> list[str]:
    """What a tuned (row, seed) trial changes in its row's configuration."""
    return [f"train.seed={seed}", *(f"{key}={value}" for key, value in setting.items())]


def parse_tuning(items: list[str] | None, budget: float | None, resolver: Resolver) -> Tuning | None:
    """`--tune train.lr_scale=0.5,1,2` (one per key) and `--tune-budget`, checked and typed by
    resolving base with each value: one line naming --tune otherwise. None without --tune."""
    if not items:
        if budget is not None:
            raise UserError("--tune-budget sets when a tuning's candidates first compete; give --tune too")
        return None
    if budget is not None and not 0 < budget <= 1:
        raise UserError(f"--tune-budget is a share of a row's steps, more than 0 and at most 1; got {budget:g}")
    values: dict[str, tuple[Any, ...]] = {}
    for item in items:
        key, sep, listed = item.partition("=")
        texts = [text.strip() for text in listed.split(",")]
        if not sep or not all(texts):
            raise UserError(f"--tune takes KEY=V1,V2,... (e.g. train.lr_scale=0.5,1,2); got {item!r}")
        try:
            (section, nested), = parse_overrides([f"{key}={texts[0]}"]).items()
        except UserError as err:
            raise UserError(f"--tune {item}: {err}") from None
        key = f"{section}.{next(iter(nested))}"
        if section != "train" or key in ROW_REFUSED or key in values:
            why = ("another --tune tunes it" if key in values else ROW_REFUSED.get(key)
                   or "a tuning tries training settings (train.*), which leave the row what it is")
            raise UserError(f"--tune {item}: {key} cannot be tuned: {why}")
        values[key] = tuple(value_of(_resolved(resolver, key, text), key) for text in texts)
        if len(set(map(repr, values[key]))) < len(texts):
            raise UserError(f"--tune {item}: a value is listed twice")
    if math.prod(len(v) for v in values.values()) > MAX_CANDIDATES:
        raise UserError(f"--tune lists {math.prod(len(v) for v in values.values())} settings a row; at most "
                        f"{MAX_CANDIDATES}")
    return Tuning(values, budget)


def _resolved(resolver: Resolver, key: str, text: str) -> RunConfig:
    try:
        return resolver.resolve("base", extra=[f"{key}={text}"])
    except UserError as err:
        raise UserError(f"--tune {key}={text}: {err}") from None


def latest(trials: list[optuna.trial.FrozenTrial], row: str, seed: int,
           setting: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
    """The newest trial of a tuned (row, seed, setting), or None (an empty claim is none)."""
    found = [t for t in trials if t.user_attrs.get(TUNE) == setting and t.user_attrs.get("row") == row
             and t.user_attrs.get("seed") == seed and not t.user_attrs.get("nothing_queued")]
    return max(found, key=lambda t: t.number, default=None)


def decide(study: optuna.Study, row: str, tried: list[tuple[dict[str, Any], optuna.trial.FrozenTrial | None]],
           ) -> TunedRow | None:
    """The row's tuning as recorded once every candidate in `tried` ((setting, its newest trial),
    the row's own first) has finished: recorded now, the first time (a later change of a run leaves
    the choice the row's other seeds trained at as it was); None while one has not."""
    if (stored := study.user_attrs.get(TUNED + row)) is not None:
        return TunedRow.model_validate(stored)
    if any(trial is None or trial.state not in FINISHED for _, trial in tried):
        return None
    candidates = [TunedCandidate(setting=setting, trial=t.number, state=t.state.name.lower(),
                                 ppl=t.value if t.state == TrialState.COMPLETE else
                                 t.intermediate_values.get(t.last_step) if t.last_step is not None else None,
                                 step=t.last_step) for setting, t in tried if t is not None]
    complete = [c for c in candidates if c.state == "complete" and c.ppl is not None and math.isfinite(c.ppl)]
    chosen = min(complete, key=lambda c: c.ppl).setting if complete else None  # ties: the earlier, own first
    record = TunedRow(own=tried[0][0], candidates=candidates, chosen=chosen)
    study.set_user_attr(TUNED + row, record.model_dump())
    return record


def describe(record: TunedRow) -> str:
    """A row's tuning in a line: each candidate's dev PPL (or where it was pruned), then the choice."""
    tried = "; ".join(f"{setting_label(c.setting)}{' (its own)' if c.setting == record.own else ''}: {c.outcome()}"
                      for c in record.candidates)
    return f"{tried}; chosen: {setting_label(record.chosen) if record.chosen else 'none complete, its own kept'}"
