"""`make test`'s time on a fresh clone, from what the run itself wrote.

The run (on an otherwise idle machine, nothing else started beside it):

    git clone <repo> fresh && cd fresh
    PYTEST_ADDOPTS="--junitxml=$PWD/../junit.xml" /usr/bin/time -v make test > ../make-test.log 2>&1

then, from this checkout:

    python benchmarks/results/test-suite-cpu-2026-11-28/summarise.py ../junit.xml ../make-test.log

writes results.json (the figures) and results.md (each test file's summed test time) beside this
script. The wall-clock is GNU time's for the whole of `make test`, set-up of the virtual environment
included; pytest's own is the one its last line prints; set-up is the difference.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # run as a script from any folder: this checkout's packages

from lightning_modules.run.environment import cpu_model  # noqa: E402


def wall_seconds(log: str) -> float:
    """GNU time -v's 'Elapsed (wall clock) time (h:mm:ss or m:ss): 17:14.93'."""
    m = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", log)
    if m is None:
        raise SystemExit("the log has no GNU time -v 'Elapsed (wall clock)' line")
    seconds = 0.0
    for part in m.group(1).split(":"):
        seconds = seconds * 60 + float(part)
    return seconds


def pytest_line(log: str) -> tuple[dict[str, int], float]:
    """pytest's last line: '985 passed, 25 skipped, 32 warnings in 876.14s (0:14:36)'."""
    m = re.findall(r"^=*\s*((?:\d+ \w+(?:, )?)+) in ([\d.]+)s", log, re.M)
    if not m:
        raise SystemExit("the log has no pytest summary line")
    counts, seconds = m[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", counts)}, float(seconds)


def main(junit: str, log_path: str) -> None:
    log = Path(log_path).read_text(errors="replace")
    total, (counts, pytest_s) = wall_seconds(log), pytest_line(log)
    per_file: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        per_file[case.get("classname", "?").split(".")[-1]] += float(case.get("time", 0))
    result = {"device": f"{cpu_model()}, {os.cpu_count()} cores", "python": platform.python_version(),
              "make_test_wall_s": round(total, 1), "pytest_wall_s": round(pytest_s, 1),
              "setup_s": round(total - pytest_s, 1), "tests": counts,
              "test_time_s": round(sum(per_file.values()), 1),
              "files": {name: round(s, 1) for name, s in per_file.most_common()}}
    (HERE / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = "\n".join(f"| `{name}.py` | {s:.1f} |" for name, s in per_file.most_common())
    (HERE / "results.md").write_text(
        f"# make test on a fresh clone: {result['device']}\n\n"
        f"make test {total / 60:.1f} min wall (set-up {result['setup_s']:.0f} s, pytest {pytest_s:.0f} s); "
        f"{', '.join(f'{n} {w}' for w, n in counts.items())}; summed test time {result['test_time_s']:.0f} s "
        "on two pytest-xdist processes.\n\n| test file | test time, s |\n|---|--:|\n" + rows + "\n")
    print((HERE / "results.md").read_text())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
