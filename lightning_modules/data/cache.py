"""The preparation cache (docs/corpora.md): what a run derives from its corpus, under a digest of all it
is derived from (inputs, settings, versions, code); a launcher prepares a corpus holding `alone`'s
lock (eight SLURM tasks on a cold cache would each encode WMT14), the others wait."""

from __future__ import annotations

import contextlib
import hashlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import BinaryIO

import filelock

from foundation.io import atomic_write_bytes

TEXT_CHUNK = 50_000  # texts hashed at a time (joined, then hashed: far faster than one update each)


def key(*parts: bytes | str | int) -> str:
    """A digest of `parts` in order, each length-prefixed (("ab", "c") and ("a", "bc") differ)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:32]


def texts_digest(texts: Sequence[str]) -> bytes:
    """A digest of `texts` (order, count, content), a chunk hashed joined by newlines, with its texts'
    lengths too where a text holds a newline, so that no two lists give the same bytes."""
    digest = hashlib.sha256(len(texts).to_bytes(8, "little"))
    for start in range(0, len(texts), TEXT_CHUNK):
        chunk = texts[start:start + TEXT_CHUNK]
        joined = "\n".join(chunk)
        if joined.count("\n") == len(chunk) - 1:  # the usual case: one text per line
            digest.update(b"\x00")
        else:
            digest.update(b"\x01" + array("Q", map(len, chunk)).tobytes())
        digest.update(joined.encode("utf-8", "surrogatepass") + b"\n")
    return digest.digest()


def source(*modules: ModuleType) -> bytes:
    """The source of the modules that derive an entry: an edited rule gives new keys."""
    return b"".join(Path(module.__file__ or "").read_bytes() for module in modules)


def entry(cache_dir: str | Path, kind: str, name: str) -> Path:
    """Where an entry of `kind` named `name` (its key and a suffix) lives."""
    return Path(cache_dir).expanduser() / kind / name


def store(path: Path, data: bytes | Callable[[BinaryIO], None]) -> bool:
    """Write an entry (`data`, or what `data(file)` writes) atomically, unsynced; False if it cannot."""
    try:
        atomic_write_bytes(path, data, sync=False)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def alone(cache_dir: str | Path, name: str, waiting: Callable[[Path], None]) -> Iterator[None]:
    """Hold the cache's lock `name` for the block (unlocked where the cache cannot be written)."""
    folder = Path(cache_dir).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(folder / f".{name}.lock")
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            waiting(Path(lock.lock_file))
            lock.acquire()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        lock.release()

