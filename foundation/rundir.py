"""What makes a folder one of our run directories (its marker `ablate-run.json`, written only into a
new or empty folder), and who is training it now (an exclusive `flock` on `.ablate-run.lock`, which
the operating system drops with the process, so it is never stale); docs/reliability.md, "A folder
that is not ours is never written into" and "One run, one trainer". In a DDP run only the global
rank-0 process takes the marker and the lock; the others wait for the marker."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from foundation.errors import RunFailed, UserError
from foundation.schema import read
from foundation.yaml_input import read_yaml
from foundation.io import atomic_write_json, check_kinds, is_temporary, not_a_link

MARKER = "ablate-run.json"  # a run directory's; a report directory has `ablate-report.json`
LOCK = ".ablate-run.lock"
CONFIG = "config.yaml"  # the run's configuration as asked for (`lightning_modules.config.to_yaml`)
PROBE = ".write-test-"  # `preflight.check_output_dir`'s probe, `.write-test-PID`
# What a run directory keeps under known names: checked up front (`check_entries`)
RUN_FILES = (MARKER, LOCK, CONFIG, "results.json", "spm.model", "spm.vocab", "trial.log", "attention.npz")
RUN_DIRS = ("checkpoints", "logs")


def _marker(out: Path, kind: str) -> Path:
    return Path(out) / f"ablate-{kind}.json"


def is_ours(out: Path, kind: str = "run") -> bool:
    """Whether `out` holds our marker of `kind` ("run" or "report"), with our format in it."""
    try:
        data = json.loads(_marker(out, kind).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == f"ablate {kind} directory"


def mark(out: Path, kind: str = "run") -> None:
    """Write the marker of `kind` into `out` (a folder this process has just made ours)."""
    if not is_ours(out, kind):
        atomic_write_json(_marker(out, kind), {"format": f"ablate {kind} directory"})  # no id: the same bytes


def claim(out: Path, kind: str = "run", option: str = "--out") -> None:
    """Make the existing `out` a directory of ours of `kind`, or refuse it (files and no marker)."""
    refuse_foreign(out, kind, option)
    if kind == "run":
        check_entries(out)
    mark(out, kind)


def check_entries(out: Path) -> None:
    """Refuse a run directory with a link among its entries or a known name of the wrong kind."""
    out = Path(out)
    if not out.is_dir():
        return
    check_kinds(out, RUN_FILES, RUN_DIRS)
    for folder in (out, *(out / name for name in RUN_DIRS)):
        if folder.is_dir():
            for path in folder.iterdir():
                not_a_link(path)


def _ours_hidden(name: str) -> bool:
    """A hidden name of ours: the lock, the write probe, a marker's temporary file."""
    return name == LOCK or name.startswith(PROBE) or any(is_temporary(name, f"ablate-{k}.json") for k in ("run", "report"))


def refuse_foreign(out: Path, kind: str = "run", option: str = "--out") -> None:
    """`claim`'s check alone, writing nothing: a missing or empty folder, or one of ours, passes."""
    out = Path(out)
    if not out.is_dir() or is_ours(out, kind):
        return
    marker = _marker(out, kind)
    if marker.exists():
        raise UserError(f"{marker} is not a marker of ours; {out} is not an ablate {kind} directory: "
                        f"give an empty or new {option}")
    held = sorted(p.name for p in out.iterdir() if not _ours_hidden(p.name))  # a user's hidden files count
    if held and not (kind == "run" and _written_before_markers(out)):
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise UserError(f"{out} is not an ablate {kind} directory (it holds {shown} and no {marker.name}); "
                        f"give an empty or new {option}")


def run_above(path: Path) -> Path | None:
    """The run directory of ours that `path` sits inside (a folder above it holding our marker), or None."""
    for parent in Path(path).absolute().parents:
        if is_ours(parent):
            return parent
    return None


NAME_MAX, PATH_MAX = 255, 4096  # bytes of one name and of a whole path (Linux's limits)


def check_path_length(path: Path, option: str) -> None:
    """A folder the file system can name: no name of it over 255 bytes, the whole under 4096."""
    full = str(Path(path).absolute())
    longest = max(Path(full).parts, key=lambda part: len(part.encode("utf-8", "surrogateescape")))
    if len(longest.encode("utf-8", "surrogateescape")) > NAME_MAX or len(full.encode("utf-8", "surrogateescape")) >= PATH_MAX:
        raise UserError(f"{option} {full[:60]}... is longer than the file system allows ({NAME_MAX} bytes a "
                        f"name, {PATH_MAX} a path); give a shorter one")


def check_apart(places: list[tuple[str, Path]]) -> None:
    """The folders one command writes (option, folder): none may hold another or sit in a run directory."""
    for option, path in places:
        check_path_length(path, option)
    resolved = [(option, Path(path).absolute().resolve()) for option, path in places]
    for i, (option, path) in enumerate(resolved):
        if (above := run_above(path)) is not None:
            raise UserError(f"{option} {places[i][1]} is inside the run directory {above}: give a folder "
                            f"outside every run directory")
        for other, there in resolved[i + 1:]:
            if other != option and (path == there or there in path.parents or path in there.parents):
                how = "is" if path == there else "is inside" if there in path.parents else "holds"
                raise UserError(f"{option} {places[i][1]} {how} the {other} folder {there}: each must be a "
                                f"folder of its own, apart from the others")


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    """The one reader of a run directory's `config.yaml`: its mapping, current shape, or None."""
    path = Path(run_dir) / CONFIG
    try:
        saved = read_yaml(path)  # the one loader: size, aliases, depth
    except (OSError, UserError):
        return None
    return read("config", saved, str(path)) if isinstance(saved, dict) else None


def _written_before_markers(out: Path) -> bool:
    saved = saved_config(out)
    return saved is not None and "preset" in saved and all(
        isinstance(saved.get(section), dict) for section in ("model", "train", "data"))


@contextmanager
def training_lock(out: Path, wait: bool = False) -> Iterator[None]:
    """Hold the run directory's lock while the block runs (see the module's docstring)."""
    path = Path(out) / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # never through a link
    except OSError as err:  # a link (ELOOP) or a directory put there since `check_entries`
        raise UserError(f"{path} cannot be our lock ({err.strerror}); it is not ours: move it away "
                        f"and run the same command again") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise RunFailed(f"{out} is being trained by {holder}; wait for it to finish, or pass --wait "
                            f"to start when it does") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # drops the lock


def global_rank_zero() -> bool:
    """Whether this is rank 0 of the whole DDP job (Lightning's rank is LOCAL_RANK where RANK is unset)."""
    from lightning.pytorch.utilities import rank_zero_only

    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    return rank_zero_only.rank == 0 and ("RANK" in os.environ or node == "0")


def wait_until_ours(out: Path, timeout_s: float = 900.0) -> None:
    """Wait (up to `timeout_s`) for rank 0 to mark `out` as a run directory of ours."""
    deadline = time.monotonic() + timeout_s
    while not is_ours(out):
        if time.monotonic() > deadline:
            raise UserError(f"{out}: rank 0 did not take the run directory within {timeout_s:g} s")
        time.sleep(0.2)
