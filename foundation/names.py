"""Names that become paths: one rule, checked up front, and one check that a path built from them
stays inside its directory (docs/reliability.md, "Names that become paths follow one rule")."""

from __future__ import annotations

import re
from pathlib import Path

from foundation.errors import UserError

MAX_LENGTH = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a file or folder, or None when it can."""
    if not isinstance(name, str):
        return f"must be text, got {type(name).__name__}"
    if not name:
        return "must not be empty"
    if len(name) > MAX_LENGTH:
        return f"is {len(name)} characters long; at most {MAX_LENGTH}"
    if not _NAME.fullmatch(name):
        return ("may hold only letters, digits and _ . + - and must start with a letter or a digit "
                "(it names a folder or file)")
    return None


def check_name(name: object, what: str, where: str = "") -> str:
    """`name` if valid, else one line naming `what` it is ("row name"), the name and `where` it was given."""
    problem = name_problem(name)
    if problem:
        raise UserError(f"{where + ': ' if where else ''}bad {what} {_shown(name)}: it {problem}")
    return name  # type: ignore[return-value]


def inside(parent: str | Path, *parts: str) -> Path:
    """`parent / parts...`, resolved, refused in one line unless it lies inside `parent`."""
    base = Path(parent).resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and base not in path.parents:
        raise UserError(f"{'/'.join(parts)!r} leads outside {parent}")
    return path


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."
