"""The benchmark command runs (tiny sizes) and writes its JSON and markdown; the numbers
themselves are measured by `python -m benchmarks`, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_benchmarks_write_json_and_markdown(tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--threads", "1", "--only",
                             "padding,scaling", "--out", str(tmp_path), "--cache-dir", str(tmp_path / "cache"),
                             "--multi30k-dir", str(tmp_path / "absent")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["benchmarks"]) == {"padding", "scaling"}
    assert data["machine"]["torch"] and data["targets"]
    padding = [t for t in data["targets"] if t["benchmark"] == "padding"]
    assert padding and all(0 <= t["value"] <= 1 for t in padding)
    assert all(t["met"] for t in padding if "ding" in t["target"].lower())  # our bucketing: ≤ 5% padding
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# Benchmarks") and "|" in md
