"""Atomic file writes: a reader sees the old file or the complete new one, never half of it; and
the checks, made before any work, that an output directory or file can be written at all."""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from foundation.errors import DiskFull, UserError
from foundation.faults import inject

_UMASK = os.umask(0o022)  # read once, at import (setting the umask to read it is not thread-safe)
os.umask(_UMASK)


# mkstemp's names for `atomic_write_bytes`'s temporary files: `.NAME.XXXXXXXX.tmp` (8 of [a-z0-9_])
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def is_temporary(name: str, of: str | None = None) -> bool:
    """Whether `name` is our atomic writes' temporary file (of `of`, if given; not a user's `.x.tmp`)."""
    match = _TEMPORARY.fullmatch(name)
    return match is not None and (of is None or match.group("name") == of)


def not_a_link(path: str | Path) -> Path:
    """`path`, unless it is a symbolic link (one line): ablate never writes or deletes through a link."""
    path = Path(path)
    if path.is_symlink():
        raise UserError(f"{path} is a symbolic link; ablate never writes or deletes through a link "
                        f"(it could reach files that are not ours): remove the link and run the same "
                        f"command again")
    return path


def check_kinds(folder: str | Path, files: tuple[str, ...] = (), dirs: tuple[str, ...] = ()) -> None:
    """Up front: none of `files` and `dirs` in `folder` is a link or of the other kind (else one line)."""
    folder = Path(folder)
    for names, want_dir in ((files, False), (dirs, True)):
        for name in names:
            path = not_a_link(folder / name)
            if path.exists() and path.is_dir() != want_dir:
                kind = "a directory" if path.is_dir() else "not a directory"
                raise UserError(f"{path} is {kind}, but ablate keeps its "
                                f"{'folder' if want_dir else 'file'} {name} there: move it away "
                                f"(it is not ours) and run the same command again")


def _mode_for(path: Path) -> int:
    """The permissions `path` keeps, or gets as a new file (mkstemp's private mode must not stay)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~_UMASK


def atomic_write_bytes(path: str | Path, data: bytes | Callable[[BinaryIO], None], fault: str | None = None,
                       step: int | None = None, sync: bool = True) -> None:
    """Write `data` (or `data(file)`) beside `path`, fsync, rename over it; `fault` just before the rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if callable(data):
                data(handle)
            else:
                handle.write(data)
            handle.flush()
            if fault:
                inject(fault, step)
            if sync:
                os.fsync(handle.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str, fault: str | None = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fault)


def atomic_write_json(path: str | Path, data: Any, fault: str | None = None) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", fault)


def write_lines(path: str | Path, lines: list[str]) -> None:
    """One sentence a line (newlines inside a sentence become spaces)."""
    atomic_write_text(path, "".join(" ".join(line.split("\n")) + "\n" for line in lines))


def _unwritable(folder: Path) -> str | None:
    """Why files cannot be created in the existing path `folder`, or None."""
    if not folder.is_dir():
        return f"{folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable"
    return None


def _no_space(err: BaseException | None) -> OSError | None:
    """The out-of-space error (ENOSPC, or a full quota) in `err` or what it happened while handling."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return err
        err = err.__context__
    return None


@contextmanager
def disk_full_ends_the_run(where: str | Path) -> Iterator[None]:
    """Writes under `where` that run out of space end in one `DiskFull` line, not a traceback."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 (re-raised unless the disk is full)
        full = _no_space(err)
        if full is None:
            raise
        raise DiskFull(f"{where}: the disk is full ({full.strerror}); free some space and run the same "
                       f"command again") from None


def first_missing(path: str | Path) -> Path | None:
    """The outermost directory on the way to `path` that does not exist yet (None: `path` exists)."""
    path = Path(path).absolute()
    missing = [p for p in (path, *path.parents) if not p.exists()]
    return missing[-1] if missing else None


def check_writable_dir(path: str | Path, what: str) -> None:
    """Fail unless `path` is a directory this process can write into or create. Creates nothing."""
    path = Path(path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    problem = _unwritable(existing)
    if problem:
        raise UserError(f"cannot write {what} to {path}: {problem}")


def check_writable_file(path: str | Path, what: str) -> None:
    """Fail unless the file `path` can be written (in an existing writable directory). Creates nothing."""
    path = Path(path).absolute()
    if path.is_dir():
        problem: str | None = f"{path} is a directory"
    elif not path.parent.exists():
        problem = f"the directory {path.parent} does not exist"
    else:
        problem = _unwritable(path.parent)
    if problem:
        raise UserError(f"cannot write {what} to {path}: {problem}")


def check_readable_file(path: str | Path, what: str = "file") -> Path:
    """`path` when it is a regular file, else one line (reading a FIFO or a device would block)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: {what} not found")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a {what}")
    if not path.is_file():
        raise UserError(f"{path}: not a regular file (a FIFO, device or socket); give a {what}")
    return path


def set_aside(path: str | Path, why: str) -> Path:
    """Move a damaged file of ours aside as `NAME.corrupt[.K]`, never deleting it, saying why."""
    path = Path(path)
    target, k = path.with_name(path.name + ".corrupt"), 1
    while target.exists():
        k += 1
        target = path.with_name(f"{path.name}.corrupt.{k}")
    try:
        path.replace(target)
    except FileNotFoundError:
        return target
    print(f"ablate: warning: {path} is damaged; set aside as {target.name} ({why})", file=sys.stderr, flush=True)
    return target
