"""How long a new user waits, from what the runs themselves wrote: `make test` on a fresh clone (and
where its CPU goes), and `make demo` on a fresh clone.

Each run on an otherwise idle machine, nothing else started beside it, with no warm caches (a new
`HOME` and `TORCHINDUCTOR_CACHE_DIR`):

    git clone <repo> fresh && cd fresh
    SUITE_CPU_LOG=$PWD/../cpu.jsonl PYTEST_ADDOPTS="--junitxml=$PWD/../junit.xml -p benchmarks.fresh_clone" \
      /usr/bin/time -v make test > ../make-test.log 2>&1
    git clone <repo> demo && cd demo && /usr/bin/time -v make demo > ../make-demo.log 2>&1

then, from this checkout:

    python -m benchmarks.fresh_clone test ../junit.xml ../make-test.log benchmarks/results/test-suite-cpu-DATE ../cpu.jsonl
    python -m benchmarks.fresh_clone demo ../make-demo.log ../demo benchmarks/results/demo-cpu-DATE

each write results.json (the figures) and results.md in that folder, made if missing. The
wall-clock is GNU time's for the whole of `make test` or `make demo`, set-up of the virtual
environment included. `make test`'s pytest time is the one its last line prints, set-up the
difference; results.md gives each test file's summed test time and CPU. `make demo`'s table time
runs from Optuna's line on creating the study to the newest file of the report, set-up is the
rest; results.md gives each row's line, and the report's table3.md is kept beside it (README's
excerpt of the demo's table is checked against it). As a pytest plugin (`-p benchmarks.fresh_clone`),
this module adds a line per test to $SUITE_CPU_LOG: its wall-clock and the CPU seconds its pytest
process spent on it, its own and those of the processes it started and waited for (a process
killed by a test, or one its child started and did not wait for, counts nowhere). CPU over wall-clock says whether more processes
could have run the suite sooner: at 2 cores' worth, nothing was left idle.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

CPU_LOG = "SUITE_CPU_LOG"


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    """The plugin: one JSON line per test (its id, wall-clock and CPU seconds) to $SUITE_CPU_LOG."""
    wall, cpu = time.monotonic(), _cpu_s()
    yield
    path = os.environ.get(CPU_LOG)
    if path:
        line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3), "cpu_s": round(_cpu_s() - cpu, 3)}
        with open(path, "a", encoding="utf-8") as log:  # one short write per line, from each process
            log.write(json.dumps(line) + "\n")


def wall_seconds(log: str) -> float:
    """GNU time -v's 'Elapsed (wall clock) time (h:mm:ss or m:ss): 17:14.93'."""
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", log)
    if m is None:
        raise SystemExit("the log has no GNU time -v 'Elapsed (wall clock)' line")
    seconds = 0.0
    for part in m.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def summary_line(log: str) -> tuple[dict[str, int], float]:
    """pytest's last line: '985 passed, 25 skipped, 32 warnings in 876.14s (0:14:36)'."""
    m = re.findall(r"^=*\s*((?:\d+ \w+(?:, )?)+) in ([\d.]+)s", log, re.M)
    if not m:
        raise SystemExit("the log has no pytest summary line")
    counts, seconds = m[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", counts)}, float(seconds)


def cpu_lines(path: str) -> list[dict[str, Any]]:
    """The plugin's lines (a line cut short by a killed process is left out)."""
    lines = []
    for text in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(text))
        except ValueError:
            continue
    return lines


def machine() -> dict[str, str]:
    """The fields every result here starts with: the CPU (name, family and model, ATen's kernels), its
    cores and Python's version (a VM's CPU name alone does not tell generations apart)."""
    import torch

    from lightning_modules.run.environment import cpu_family, cpu_model

    cpu = "; ".join(part for part in (cpu_family(), f"ATen {torch.backends.cpu.get_cpu_capability()}") if part)
    return {"device": f"{cpu_model()} ({cpu}), {os.cpu_count()} cores", "python": platform.python_version()}


def write(out: str, result_json: str, markdown: str, **more: str) -> None:
    """results.json, results.md and `more`'s files written atomically into `out`; the markdown printed."""
    from foundation.io import atomic_write_text

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in {"results.json": result_json, "results.md": markdown, **more}.items():
        atomic_write_text(folder / name, text)
    print(markdown)


def suite(junit: str, log_path: str, out: str, cpu_log: str | None = None) -> None:
    """`make test`'s figures: wall-clock, set-up, pytest, each file's test time (and CPU)."""
    log = Path(log_path).read_text(errors="replace")
    total, (counts, pytest_s) = wall_seconds(log), summary_line(log)
    per_file: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        per_file[case.get("classname", "?").split(".")[-1]] += float(case.get("time", 0))
    result: dict[str, Any] = {
        **machine(), "make_test_wall_s": round(total, 1), "pytest_wall_s": round(pytest_s, 1),
        "setup_s": round(total - pytest_s, 1), "tests": counts, "test_time_s": round(sum(per_file.values()), 1),
        "files": {name: round(s, 1) for name, s in per_file.most_common()}}
    cpu: Counter[str] = Counter()
    heaviest: list[dict[str, Any]] = []
    if cpu_log:
        lines = cpu_lines(cpu_log)
        for line in lines:
            cpu[Path(line["test"].split("::")[0]).stem] += line["cpu_s"]
        heaviest = sorted(lines, key=lambda line: -line["cpu_s"])[:15]
        result |= {"test_cpu_s": round(sum(cpu.values()), 1),
                   "cores_busy": round(sum(cpu.values()) / pytest_s, 2),
                   "files_cpu_s": {name: round(cpu[name], 1) for name in result["files"]},
                   "heaviest_tests": heaviest}
    head = f" {result['test_cpu_s']:.0f} CPU s in the tests, {result['cores_busy']:.2f} cores busy on average " \
        "while pytest ran." if cpu_log else ""
    columns = ["test file", "test time, s", *(["CPU, s"] if cpu_log else [])]
    rows = [[f"`{name}.py`", f"{s:.1f}", *([f"{cpu[name]:.1f}"] if cpu_log else [])] for name, s in per_file.most_common()]
    tables = table(columns, rows)
    if cpu_log:
        tables += "\n\nThe tests that took the most CPU:\n\n" + table(
            ["test", "wall-clock, s", "CPU, s"],
            [[f"`{line['test']}`", f"{line['wall_s']:.1f}", f"{line['cpu_s']:.1f}"] for line in heaviest])
    write(out, json.dumps(result, indent=1) + "\n",
          f"# make test on a fresh clone: {result['device']}\n\n"
          f"make test {total / 60:.1f} min wall (set-up {result['setup_s']:.0f} s, pytest {pytest_s:.0f} s); "
          f"{', '.join(f'{n} {w}' for w, n in counts.items())}; summed test time {result['test_time_s']:.0f} s "
          f"on two pytest-xdist processes.{head}\n\n{tables}\n")


def table(columns: list[str], rows: list[list[str]], left: tuple[int, ...] = (0,)) -> str:
    """A markdown table: the columns numbered in `left` left-aligned, the others right-aligned."""
    rule = "".join("---|" if i in left else "--:|" for i in range(len(columns)))
    return "\n".join([f"| {' | '.join(columns)} |", f"|{rule}", *(f"| {' | '.join(row)} |" for row in rows)])


STUDY_CREATED = re.compile(r"^\[I (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] A new study created", re.M)
ROW_LINE = re.compile(r"^(\S+) seed (\d+): ([^,]+), dev PPL ([\d.]+), dev BLEU ([\d.]+), ([\d.]+) s training, "
                      r"([\d,]+) parameters$", re.M)


def demo(log_path: str, clone: str, out: str) -> None:
    """`make demo`'s figures: wall-clock, set-up, the table, each row's line."""
    log = Path(log_path).read_text(errors="replace")
    total, created = wall_seconds(log), STUDY_CREATED.search(log)
    if created is None:
        raise SystemExit("the log has no Optuna line creating the study (was the study new?)")
    report = Path(clone) / "runs" / "table3" / "table3-demo" / "report"
    written = [path.stat().st_mtime for path in report.rglob("*") if path.is_file()]
    if not written:
        raise SystemExit(f"no report in {report}")
    # Optuna logs the machine's local time, as datetime.timestamp() reads a time without a zone
    table_s = max(written) - datetime.strptime(created.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    rows = [{"row": row, "seed": int(seed), "class": label, "dev_ppl": float(ppl), "dev_bleu": float(bleu),
             "training_s": float(seconds), "parameters": int(params.replace(",", ""))}
            for row, seed, label, ppl, bleu, seconds, params in ROW_LINE.findall(log)]
    result = {**machine(), "make_demo_wall_s": round(total, 1), "table_s": round(table_s, 1),
              "setup_s": round(total - table_s, 1), "rows": rows}
    columns = ["row", "seed", "class", "dev PPL", "dev BLEU", "training, s", "parameters"]
    cells = [[r["row"], str(r["seed"]), r["class"], str(r["dev_ppl"]), str(r["dev_bleu"]), str(r["training_s"]),
              f"{r['parameters']:,}"] for r in rows]
    write(out, json.dumps(result, indent=2) + "\n",
          f"# make demo on a fresh clone: {result['device']}\n\n"
          f"make demo {total / 60:.1f} min wall (set-up {result['setup_s']:.0f} s, the table {table_s:.0f} s); "
          f"{len(rows)} rows.\n\n{table(columns, cells, left=(0, 2))}\n",
          **{"table3.md": (report / "table3.md").read_text(encoding="utf-8")})


if __name__ == "__main__":
    commands = {"test": (suite, (3, 4)), "demo": (demo, (3,))}
    if len(sys.argv) < 2 or sys.argv[1] not in commands or len(sys.argv) - 2 not in commands[sys.argv[1]][1]:
        raise SystemExit(__doc__)
    command, _ = commands[sys.argv[1]]
    command(*sys.argv[2:])
