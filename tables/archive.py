"""A table's runs kept in a folder that outlives the machine (`ablate table3 --archive DIR`).

A long table runs in sittings, and the next sitting may be on another machine: a cloud VM given
back, a cluster's scratch space purged, a laptop. The study database only indexes the runs; the
run directories are the record. The archive keeps the part of each planned run's directory that
a fresh machine needs, as `DIR/<row>-s<seed>/`:

- a finished run: `results.json`, `config.yaml`, `logs/metrics.csv` (its whole curve, every
  attempt joined: `metrics_log.read_rows`), the dev sources, references and translations, and
  `attention.npz` (every head on one dev sentence, tens of kilobytes: the report draws from it);
- an unfinished run: `config.yaml`, `logs/` as it stands (each attempt's part) and its newest
  checkpoint, from which it resumes as it would have on the old machine;
- a failed run (a NaN loss): its `results.json` and logs, so that it stays failed.

`DIR/table3.json` holds the table's identity (`tables.plan.identity`): the table refuses an
archive of another table. `DIR/study.journal.xz` holds the whole study as an Optuna journal file,
xz-compressed (`save_study`): every trial with its number and user attributes, so the redos' history
(`tables.redo`) and the failed runs travel with the runs.

At a sitting's start, a storage that lacks the study gets the archived one (`restore_study`; a
trial it holds as running had its worker on the old machine: it fails and is queued again, as a
heartbeat would have it), and every planned run whose directory has neither a `results.json` nor
a checkpoint is restored from DIR (what the machine holds always wins); the workers then adopt a
restored finished run the study does not hold as complete (`train` reuses a complete results.json
of the same configuration: `preflight.check_same_result`; a run that finished after the journal
was saved) and resume an unfinished one. The table saves DIR every `SAVE_EVERY_S` while it runs
and when it ends, interrupted too, the journal before the runs (so no run is older there than the
journal says); every file is written atomically, and the journal only when the study has changed,
so DIR can be committed or synced at any moment.

Only what is ours is written, replaced or deleted: an entry, or a run directory it restores
into, that holds a symbolic link (its `logs/` pointing at a user's folder, say) or a known name
of the wrong kind is refused in one line before anything is restored or saved
(`check_owned`), and no save follows a link (`rundir.check_entries`).
"""

from __future__ import annotations

import csv
import io
import json
import lzma
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from foundation.errors import UserError
from lightning_modules.metrics_log import METRICS, read_rows
from lightning_modules.run.attention_figures import ATTENTION_FILE
from foundation.io import (atomic_write_bytes, atomic_write_json, check_kinds, check_writable_dir,
                                     not_a_link)
from foundation.rundir import CONFIG, check_entries, mark, refuse_foreign
from lightning_modules.run.results import RESULTS, read_results
from sweeps.optuna_api import quiet_optuna
from ablations.record import read_table

SAVE_EVERY_S = 600.0
MAX_JOURNAL_BYTES = 256 * 2 ** 20  # a study journal unpacked (a 50-run table's: 3.5 MB)
IDENTITY = "table3.json"
STUDY = "study.journal.xz"
DEV_FILES = ("dev.src.txt", "dev.ref.txt", "dev.hyp.txt")
FINISHED_FILES = (*DEV_FILES, ATTENTION_FILE)  # a finished run's, beside results.json and its curve


def entry(archive: Path, row: str, seed: int) -> Path:
    return archive / f"{row}-s{seed}"


def _write(dst: Path, data: bytes) -> None:
    """`data` to `dst` atomically, unless `dst` holds the same bytes already."""
    if not (dst.is_file() and dst.stat().st_size == len(data) and dst.read_bytes() == data):
        atomic_write_bytes(dst, data)


def _copy(src: Path, dst: Path) -> None:
    _write(dst, src.read_bytes())


def _remove_except(folder: Path, keep: set[str]) -> None:
    """Files in `folder` not named in `keep` (what the run directory no longer has); never
    through a link (`check_owned` refused any before)."""
    if not_a_link(folder).is_dir():
        for path in folder.iterdir():
            if not path.is_symlink() and path.is_file() and path.name not in keep:
                path.unlink()


def _check_entry(place: Path) -> None:
    """An archive entry, or a run directory it is restored into: no link, no known name of the
    wrong kind (`rundir.check_entries`)."""
    check_entries(not_a_link(place))


def check_owned(runs: dict[tuple[str, int], Path], archive: Path) -> None:
    """Before anything is restored or saved: the archive is new, empty or an archive of ours (it
    holds `table3.json`: a folder of the user's, a copy of a run of theirs say, is never written),
    and its own files and every planned run's entry and run directory are ours to write (one line
    naming the first that is not)."""
    if not archive.is_dir():
        return
    held = sorted(p.name for p in archive.iterdir())
    if held and IDENTITY not in held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise UserError(f"--archive {archive} is not a table's archive (it holds {shown} and no {IDENTITY}): "
                        f"give an empty or new folder, or the archive a table made")
    check_kinds(archive, (IDENTITY, STUDY))
    for (row, seed), run_dir in runs.items():
        _check_entry(entry(archive, row, seed))
        _check_entry(run_dir)


def _joined_metrics(log_dir: Path) -> bytes:
    """The run's whole curve as one metrics.csv (columns in the order first seen)."""
    rows = read_rows(log_dir)
    columns = dict.fromkeys(column for row in rows for column in row)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns))  # \r\n, as Lightning's CSVLogger writes
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def _whole_lines(data: bytes) -> bytes:
    """A log being appended to as it is read, without its unfinished last line."""
    return data if not data or data.endswith(b"\n") else data[:data.rfind(b"\n") + 1]


def has_checkpoint(run_dir: Path) -> bool:
    return any(run_dir.glob("checkpoints/*.ckpt"))


def save_run(run_dir: Path, dest: Path) -> None:
    """The part of one run directory a fresh machine needs (see the module's docstring)."""
    done = read_results(run_dir)
    if done is None and not has_checkpoint(run_dir):
        return  # not started, or nothing to resume from yet
    _check_entry(dest)
    if (run_dir / CONFIG).is_file():
        _copy(run_dir / CONFIG, dest / CONFIG)
    if done is not None:  # a failed run's results.json too: it stays failed on the next machine
        _copy(run_dir / RESULTS, dest / RESULTS)
    if done is not None and done.complete:
        _write(dest / "logs" / METRICS, _joined_metrics(run_dir / "logs"))
        _remove_except(dest / "logs", {METRICS})
        for name in FINISHED_FILES:
            if (run_dir / name).is_file():
                _copy(run_dir / name, dest / name)
        if (dest / "checkpoints").is_dir():
            shutil.rmtree(dest / "checkpoints")
        return
    logs = [p for p in (run_dir / "logs").glob("*") if p.is_file()]
    for path in logs:
        _write(dest / "logs" / path.name, _whole_lines(path.read_bytes()))
    _remove_except(dest / "logs", {p.name for p in logs})
    if done is not None:  # failed: nothing to resume
        _remove_except(dest / "checkpoints", set())
        return
    from lightning_modules.run.preflight import resume_checkpoint  # loads torch: only for a run under way

    if found := resume_checkpoint(run_dir / "checkpoints"):  # the newest that loads, as a resume takes it
        checkpoint = found[0]
        try:
            _copy(checkpoint, dest / "checkpoints" / checkpoint.name)
        except FileNotFoundError:  # replaced by a newer one while we looked: the next save takes it
            return
        _remove_except(dest / "checkpoints", {checkpoint.name})


def save(runs: dict[tuple[str, int], Path], archive: Path, identity: dict[str, Any],
         study: tuple[BaseStorage, str] | None = None) -> None:
    """The table's identity, its study (first: see the module's docstring) and every planned run's
    record into `archive`."""
    archive.mkdir(parents=True, exist_ok=True)
    atomic_write_json(archive / IDENTITY, identity)
    if study is not None:
        save_study(*study, archive)
    for (row, seed), run_dir in runs.items():
        if run_dir.is_dir():
            save_run(run_dir, entry(archive, row, seed))



@contextmanager
def archived_study(archive: Path) -> Iterator[tuple[JournalStorage, str] | None]:
    """The study kept in `archive` (its journal unpacked into a temporary file, for the block) and
    its name; None: none there."""
    path = archive / STUDY
    if not path.is_file():
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="ablate-study-") as tmp:
        unpacked = Path(tmp) / "study.journal"
        unpack_capped(path, unpacked)
        try:
            storage = JournalStorage(JournalFileBackend(str(unpacked)))
            names = optuna.get_all_study_names(storage)
        except Exception as err:  # Optuna replays any line it finds: whatever it trips on, the file is not a journal
            raise UserError(f"{path} is not an Optuna journal ({type(err).__name__}: {err}); "
                            f"is --archive a table's archive?") from None
        if len(names) != 1:
            raise UserError(f"{path} holds {len(names)} studies, not one table's; is --archive a table's archive?")
        yield storage, names[0]


def unpack_capped(path: Path, dest: Path, cap: int = MAX_JOURNAL_BYTES) -> None:
    """Unpack the xz file `path` into `dest` as a stream, a MiB at a time, refusing it in one line
    once it unpacks to more than `cap` bytes (an xz bomb: 3.7 MB that unpack to 24 GiB grew the
    process to 7.5 GB), or when it is not xz or cut short."""
    try:
        with lzma.open(path, "rb") as packed, dest.open("wb") as out:
            total = 0
            while chunk := packed.read(1 << 20):
                total += len(chunk)
                if total > cap:
                    raise UserError(f"{path} unpacks to more than {cap // 2 ** 20} MiB, the most a table's "
                                    f"study journal may be; is --archive a table's archive?")
                out.write(chunk)
    except (lzma.LZMAError, EOFError) as err:
        raise UserError(f"{path} is not readable ({err or 'cut short'}); is --archive a table's archive?") from None


def check_study_file(archive: Path) -> None:
    """The archived study, replayed once in a temporary folder before anything else is written:
    a truncated, garbage or oversized `study.journal.xz` is refused in one line, up front."""
    with archived_study(archive):
        pass


def study_content(storage: BaseStorage, name: str) -> str:
    """What a copy of the study must hold, as JSON: its direction, user attributes and every trial
    (not the ids a storage gives, nor the study's name)."""
    study = optuna.load_study(study_name=name, storage=storage)
    trials = [[t.number, t.state.name, t.values, t.params, t.distributions, t.user_attrs, t.system_attrs,
               t.intermediate_values, t.datetime_start, t.datetime_complete] for t in study.get_trials(deepcopy=False)]
    return json.dumps([[d.name for d in study.directions], study.user_attrs, trials], sort_keys=True, default=str)


def save_study(storage: BaseStorage, name: str, archive: Path) -> None:
    """The whole study as `archive/study.journal.xz`: `optuna.copy_study` into a journal file made
    in a temporary folder, xz-compressed (a quarter of its size: every run repeats the same dev
    references), written atomically; not when the archive holds the same study already (a
    journal's bytes differ from one copy to the next: Optuna names its writer in each line)."""
    with archived_study(archive) as kept:
        if kept is not None and study_content(*kept) == study_content(storage, name):
            return
    with tempfile.TemporaryDirectory(prefix="ablate-study-") as tmp, quiet_optuna():
        path = Path(tmp) / "study.journal"
        optuna.copy_study(from_study_name=name, from_storage=storage,
                          to_storage=JournalStorage(JournalFileBackend(str(path))))
        atomic_write_bytes(archive / STUDY, lzma.compress(path.read_bytes()))


def restore_study(archive: Path, storage: BaseStorage, name: str) -> int:
    """Copy the study kept in `archive` into `storage` as `name` when the storage has no study of
    that name (a fresh machine, a database deleted); trial numbers stay as they were. A trial it
    holds as running lost its worker with the old machine: it fails, and a copy is queued to
    resume its run (`sweeps.optuna_api.queue_retry`, as for a heartbeat that stopped). Returns how
    many trials came back (0: nothing copied)."""
    from sweeps.optuna_api import fail_running_trial, frozen_trial, queue_retry

    with archived_study(archive) as kept:
        if kept is None or name in optuna.get_all_study_names(storage):
            return 0
        try:
            with quiet_optuna():
                optuna.copy_study(from_study_name=kept[1], from_storage=kept[0], to_storage=storage,
                                  to_study_name=name)
        except optuna.exceptions.DuplicatedStudyError:  # another launcher of the table copied it just now
            return 0
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        if trial.state == TrialState.RUNNING and fail_running_trial(storage, name, trial.number):
            queue_retry(study, frozen_trial(storage, name, trial.number))
    return len(trials)


def stored_identity(archive: Path) -> dict[str, Any] | None:
    """The record of the table archived in `archive`, in the current version's shape (`schema.read`;
    None: no archive there yet)."""
    path = archive / IDENTITY
    if not path.is_file():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"{path} is not readable ({err}); is --archive a table's archive?") from None
    if not isinstance(stored, dict):
        raise UserError(f"{path} is not a table's record; is --archive a table's archive?")
    return read_table(stored, str(path))


def restore(runs: dict[tuple[str, int], Path], archive: Path) -> list[str]:
    """Copy each archived run into its run directory where that holds neither a results.json nor
    a checkpoint; returns the runs restored ('C3 seed 1 (checkpoint)', 'base seed 2 (complete)')."""
    if not archive.is_dir():
        return []
    check_owned(runs, archive)  # before anything is copied
    restored = []
    for (row, seed), run_dir in runs.items():
        src = entry(archive, row, seed)
        if not src.is_dir() or (run_dir / RESULTS).is_file() or has_checkpoint(run_dir):
            continue
        check_writable_dir(run_dir, f"the run directory of {row} seed {seed}")
        refuse_foreign(run_dir, option=f"run directory of {row} seed {seed}")
        for path in sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink()):
            _copy(path, run_dir / path.relative_to(src))
        mark(run_dir)  # ours: restored by the table into its own run directory
        done = read_results(src)
        restored.append(f"{row} seed {seed} ({'checkpoint' if done is None else done.status})")
    return restored


@contextmanager
def kept_in(runs: dict[tuple[str, int], Path], archive: Path, identity: dict[str, Any],
            study: tuple[BaseStorage, str] | None = None, every_s: float = SAVE_EVERY_S) -> Iterator[None]:
    """Save the archive (`save`; `study`: the table's storage and study name) every `every_s`
    seconds while the body runs, and once more when it ends (however it ends). A save that fails
    says so in one line; the table goes on."""
    stop = threading.Event()

    def save_now() -> None:
        try:
            save(runs, archive, identity, study)
        except (OSError, UserError, optuna.exceptions.OptunaError) as err:  # a full disk; a link put there; a busy database
            print(f"table3: could not save --archive {archive}: {err}", file=sys.stderr, flush=True)

    def loop() -> None:
        while not stop.wait(every_s):
            save_now()

    thread = threading.Thread(target=loop, name="table3-archive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        save_now()
