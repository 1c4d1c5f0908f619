"""A run's logged metrics across resumptions: Lightning's CSVLogger deletes `logs/metrics.csv` when it
starts, so a resumed run sets it aside first (`set_aside`) and `read_rows` joins the parts."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from foundation.errors import UserError

METRICS = "metrics.csv"
_PART = re.compile(r"metrics\.part-(\d+)\.until-(\d+)\.csv$")


def _parts(log_dir: Path) -> list[tuple[int, int, Path]]:
    """(K, STEP, path) of the set-aside parts, oldest attempt first."""
    matches = ((_PART.match(path.name), path) for path in log_dir.glob("metrics.part-*.csv"))
    return sorted((int(match.group(1)), int(match.group(2)), path) for match, path in matches if match)


def set_aside(log_dir: Path, step: int) -> Path | None:
    """Rename the log of an attempt the coming one resumes at `step` (if any); the new name."""
    current = log_dir / METRICS
    if not current.is_file():
        return None
    target = log_dir / f"metrics.part-{len(_parts(log_dir)) + 1}.until-{step}.csv"
    try:
        current.replace(target)
    except FileNotFoundError:  # another process of the same run set it aside first
        return None
    return target


def _read(path: Path) -> list[dict[str, str]]:
    """A log's rows (a whole-number step, numbers or nothing elsewhere), or one line naming the file."""
    try:
        text = path.read_bytes().decode("utf-8")
        text = text[:text.rfind("\n") + 1]  # a line still being written (a run logging now) is not read yet
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except (UnicodeDecodeError, csv.Error) as err:
        raise _damaged(path, f"not CSV text ({type(err).__name__})") from None
    for line, row in enumerate(rows, start=2):
        if not row.get("step"):
            raise _damaged(path, f"line {line} has no step")
        for column, value in row.items():
            try:
                int(value) if column == "step" else float(value) if value else None
            except (TypeError, ValueError):  # TypeError: a row with more fields than the header
                raise _damaged(path, f"line {line}: {str(value)[:20]!r} is not a number") from None
    return rows


def _damaged(path: Path, what: str) -> UserError:
    return UserError(f"{path} is damaged ({what}); a run writes it: move it away (the run's checkpoints and "
                     f"results.json do not need it) and run the command again")


def read_rows(log_dir: str | Path) -> list[dict[str, str]]:
    """Every row of the run's history, oldest first: each attempt's up to the step the next resumed at."""
    log_dir = Path(log_dir)
    history: list[dict[str, str]] = []
    for _, until, path in _parts(log_dir):
        # the next attempt restarted at `until`: what any attempt logged after it was redone
        history = [r for r in history + _read(path) if int(r["step"]) <= until]
    current = log_dir / METRICS
    return history + (_read(current) if current.is_file() else [])


def logged(log_dir: str | Path, column: str) -> dict[int, float]:
    """The run's logged values of `column` (e.g. val/ppl, train/loss) by step, every attempt joined."""
    return {int(row["step"]): float(row[column]) for row in read_rows(log_dir) if row.get(column)}


def last_step(log_dir: Path) -> int:
    """The last training step a run logged, every attempt joined (0 for none, or no logs folder)."""
    return max((int(row["step"]) for row in read_rows(log_dir) if row.get("step")), default=0)
