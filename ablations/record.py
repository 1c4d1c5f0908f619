"""A table's names and record, in one place for the table and its report: its study's kind, its
runs' names, and the record it keeps of itself, typed once where it is read."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from foundation.records import validated
from foundation.schema import read

KIND = "table3"  # a table's study's `kind` user attribute (any spec's table: the name is the first one's)
CORPUS = "corpus"  # its user attribute holding each row's corpus digest (`tables.plan.check_data`)
# A tuned table (`tables.tune`): a tuned run's setting attribute ({key: value}), the study's record of
# what was tuned, and each decided row's record under TUNED + row (`TunedRow`)
TUNE, TUNING, TUNED = "tune", "tuning", "tuned:"


class TableRecord(BaseModel):
    """A table's record as stored (a study's user attributes, an archive's table3.json)."""

    model_config = ConfigDict(extra="allow")
    kind: str
    preset: str
    spec: dict[str, dict[str, Any]]
    overrides: list[str] = []
    config: str | None = None
    setup: dict[str, Any] = {}
    runs: dict[str, dict[str, Any]] = {}
    corpus: dict[str, str] = {}
    tuning: dict[str, Any] = {}


class TunedCandidate(BaseModel):
    """One candidate of a row's tuning: its setting, trial, end (complete, pruned, fail), dev PPL then."""

    setting: dict[str, Any]
    trial: int
    state: str
    ppl: float | None = None
    step: int | None = None

    def outcome(self) -> str:
        """`24.31`, `pruned at step 1,200 (31.07)`, `fail`."""
        ppl = "" if self.ppl is None else f"{self.ppl:.2f}"
        if self.state == "pruned":
            return f"pruned at step {self.step:,}" + (f" ({ppl})" if ppl else "")
        return ppl if self.state == "complete" and ppl else self.state


class TunedRow(BaseModel):
    """A row's decided tuning: its own value, every candidate, the chosen (None: none completed)."""

    own: dict[str, Any]
    candidates: list[TunedCandidate]
    chosen: dict[str, Any] | None = None


def tuned_rows(record: dict[str, Any], source: str) -> dict[str, TunedRow]:
    """The decided rows of a table's record (its TUNED + row entries), typed (else one line)."""
    return {key[len(TUNED):]: validated(TunedRow, value, f"{source}: {key}")
            for key, value in record.items() if key.startswith(TUNED)}


def read_table(stored: dict[str, Any], source: str) -> dict[str, Any]:
    """A table's record of any version, typed once (else one line naming `source` and the field)."""
    return validated(TableRecord, read("table", stored, source), source).model_dump()


def run_name(row: str, seed: int) -> str:
    """A planned run's name: its run directory's, and its key in the table's identity."""
    return f"{row}-s{seed}"


def value_text(value: Any) -> str:
    """A tuned value as names and labels write it: `0.5`, `2`, `cosine`."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _parts(setting: dict[str, Any]) -> list[tuple[str, str]]:
    """(`lr_scale`, `0.5`) for each key of a tuned setting."""
    return [(key.rsplit(".", 1)[-1], value_text(value)) for key, value in setting.items()]


def tuned_name(row: str, setting: dict[str, Any]) -> str:
    """A tuned run's row as its run directory and archive entry name it: `E+lr_scale2`."""
    return "+".join([row, *(name + value for name, value in _parts(setting))])


def setting_label(setting: dict[str, Any] | None) -> str:
    """A tuned setting as text: `lr_scale 0.5` (several keys joined by commas)."""
    return ", ".join(f"{name} {value}" for name, value in _parts(setting or {}))


def aside_name(name: str, number: int) -> str:
    """The name trial `number`'s run directory or archive entry `name` is set aside as by a redo."""
    return f"{name}.superseded-t{number}"
