"""Does bf16 autocast on a CPU change what a table says? (issue #75)

    python benchmarks/results/bf16-science-cpu-2026-12-02/compare.py [RUNS_DIR]

With RUNS_DIR (the tables' --runs-dir, holding the studies demo-fp32, demo-bf16, cpu-fp32 and
cpu-bf16: STUDY/ROW-sSEED/results.json and STUDY/report/table3.csv), it first copies into this
folder runs.csv (one line a finished run) and each study's report table as STUDY.table3.csv. Then,
from those files alone, comparison.csv and comparison.md: per table and row, the fp32 dev PPL (mean
and 95% seed interval, as the report gives them), the bf16 mean and whether it lies inside that
interval, bf16 - fp32 paired by seed (same seed: same initial weights, batches and dropout masks)
with its 95% interval, and each precision's report's difference to base (its one test: interval,
p, and q after correcting for all the table's comparisons) with the verdict it gives.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

from foundation.io import atomic_write_text
from reports.seeds import difference_ci, mean_ci

HERE = Path(__file__).resolve().parent
TABLES = ("demo", "cpu")
PRECISIONS = {"fp32": "32-true", "bf16": "bf16-mixed"}  # the studies' names -> the runs' train.precision
RUN_FIELDS = ("row", "seed", "steps", "ppl", "bleu", "convergence")  # no times: the machine was shared


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def collect(runs_dir: Path) -> None:
    """runs.csv (every complete run, its precision checked against its study's) and the reports' tables."""
    lines = []
    for table in TABLES:
        for precision, lightning in PRECISIONS.items():
            study = runs_dir / f"{table}-{precision}"
            if not (study / "report" / "table3.csv").is_file():
                continue  # a table not run (or not reported) yet
            for path in sorted(study.glob("*-s*/results.json")):
                result = json.loads(path.read_text())
                if result.get("status") == "complete":
                    assert result["precision"] == result["environment"]["precision"] == lightning, path
                    lines.append({"table": table, "precision": precision, **{k: result[k] for k in RUN_FIELDS}})
            atomic_write_text(HERE / f"{study.name}.table3.csv", (study / "report" / "table3.csv").read_text())
    atomic_write_text(HERE / "runs.csv", to_csv(lines))


def against_base(r: dict[str, str]) -> tuple[str, str]:
    """A report row's difference to base in words, and its verdict (uncorrected; '*' after correction)."""
    if r["row"] == "base" or not r["d_ppl_low"]:
        return "", ""
    verdict = ("higher" if float(r["d_ppl"]) > 0 else "lower") if r["beyond_noise"] == "True" else "within noise"
    return (f"{float(r['d_ppl']):+.1f} [{float(r['d_ppl_low']):+.1f}, {float(r['d_ppl_high']):+.1f}], "
            f"p {float(r['ppl_p']):.3f}, q {float(r['ppl_q']):.2f}", verdict + ("*" if float(r["ppl_q"]) < 0.05 else ""))


def compare() -> list[dict]:
    ppl: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in csv.DictReader((HERE / "runs.csv").open()):
        ppl.setdefault((r["table"], r["precision"], r["row"]), {})[int(r["seed"])] = float(r["ppl"])
    out = []
    for table in [t for t in TABLES if all((HERE / f"{t}-{p}.table3.csv").is_file() for p in PRECISIONS)]:
        reports = {p: {r["row"]: r for r in csv.DictReader((HERE / f"{table}-{p}.table3.csv").open())}
                   for p in PRECISIONS}
        for row in reports["fp32"]:
            fp32, bf16 = ppl[table, "fp32", row], ppl[table, "bf16", row]
            seeds, shift = mean_ci(list(fp32.values())), difference_ci(bf16, fp32)[0]
            mean = mean_ci(list(bf16.values())).mean
            (d32, v32), (d16, v16) = (against_base(reports[p][row]) for p in PRECISIONS)
            out.append({"table": table, "row": row, "seeds": f"{len(fp32)}/{len(bf16)}",
                        "fp32 PPL": f"{seeds.mean:.2f} [{seeds.low:.2f}, {seeds.high:.2f}]", "bf16 PPL": f"{mean:.2f}",
                        "inside": "yes" if seeds.low <= mean <= seeds.high else "no" if not math.isnan(seeds.low) else "",
                        "bf16 − fp32": f"{shift.mean:+.2f} [{shift.low:+.2f}, {shift.high:+.2f}]",
                        "vs base, fp32": d32, "verdict fp32": v32, "vs base, bf16": d16, "verdict bf16": v16,
                        "changed": "yes" if v32 != v16 else ""})
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r.values()) + " |" for r in rows]
    for table in sorted({r["table"] for r in rows}, key=TABLES.index):
        part = [r for r in rows if r["table"] == table]
        changed = [r["row"] for r in part if r["changed"]]
        after = [r["row"] for r in part if ("*" in r["verdict fp32"]) != ("*" in r["verdict bf16"])]
        lines += ["", f"{table}: {sum(r['inside'] == 'yes' for r in part)} of {len(part)} rows' bf16 dev PPL inside "
                      f"the fp32 seed interval; verdicts against base changed: {', '.join(changed) or 'none'}; "
                      f"after correcting for the table's comparisons (q < 0.05, marked *): {', '.join(after) or 'none'}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        collect(Path(sys.argv[1]))
    compared = compare()
    atomic_write_text(HERE / "comparison.csv", to_csv(compared))
    atomic_write_text(HERE / "comparison.md", markdown(compared))
    print(markdown(compared), end="")
