"""Make a Table 3: run it (`plan.run_table3`, which checks the data before anything is queued),
then write its report (`reports.build.build_report`, from the database). The one entry point that
`ablate table3` and a notebook share: `make_table3(make_plan(...))`.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from tables.cost import parts_note, run_seconds
from tables.plan import Table3Outcome, Table3Plan, check_places, run_table3


def make_table3(plan: Table3Plan, workers: int = 1, devices: list[str] | None = None, devices_per_run: int = 1,
                heartbeat_s: int = 60, archive: str | None = None, stop_after_s: float | None = None,
                report: bool = True, report_dir: str | Path | None = None, wandb_report: str = "off") -> Table3Outcome:
    """`run_table3` (see it for the arguments), then, unless interrupted and when `report`, the
    report (`build_report`) in `report_dir` (default RUNS_DIR/STUDY/report), whose files the
    outcome lists. The report's folder is checked before the table runs, not after."""
    folder = Path(report_dir) if report_dir is not None else Path(plan.runs_dir) / plan.study / "report"
    expected = run_seconds(plan, workers, devices) if stop_after_s is not None else None
    if expected and (note := parts_note(expected, stop_after_s)):
        print(f"table3 {plan.study}: {note}", file=sys.stderr, flush=True)
    check_places(plan, archive, folder if report else None)
    outcome = run_table3(plan, workers, devices, devices_per_run, heartbeat_s, archive=archive,
                         stop_after_s=stop_after_s, run_seconds=expected)
    if outcome.interrupted or not report:
        return outcome
    from reports.build import build_report  # pandas, matplotlib: once the table is done

    return replace(outcome, report=build_report(plan.storage, plan.study, folder, wandb=wandb_report,
                                                  runs_dir=plan.runs_dir))
