"""A table's names and record, in one place for the table (`tables`) and its report
(`reports.collect`): what kind of study a table's is, what its runs are called, and the record it
keeps of itself in its study's user attributes and its archive's table3.json (each run's
configuration, the preset, the spec's rows, the overrides, the setup and the corpus's digests),
typed once where it is read (`foundation.records`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from foundation.records import validated
from foundation.schema import read

KIND = "table3"  # a table's study's `kind` user attribute (any spec's table: the name is the first one's)
CORPUS = "corpus"  # its user attribute holding each row's corpus digest (`tables.plan.check_data`)


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


def read_table(stored: dict[str, Any], source: str) -> dict[str, Any]:
    """A table's record of any version (`schema.read`), typed once: one line naming `source` and
    the field that is not what a table writes."""
    return validated(TableRecord, read("table", stored, source), source).model_dump()


def run_name(row: str, seed: int) -> str:
    """A planned run's name: its run directory's, and its key in the table's identity."""
    return f"{row}-s{seed}"


def aside_name(name: str, number: int) -> str:
    """The name trial `number`'s run directory or archive entry `name` is set aside as by a redo."""
    return f"{name}.superseded-t{number}"
