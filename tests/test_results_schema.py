"""`RunResult`: one schema for results.json, the trial's attributes, the report's columns and the
W&B summary (files of other versions: test_schema.py)."""

from __future__ import annotations

from dataclasses import fields

from lightning_modules.run.results import RESULTS, RunResult, read_results
from foundation.schema import SCHEMA
from reports.collect import RUN_COLUMNS


def test_every_field_is_documented_and_routed():
    for f in fields(RunResult):
        assert f.metadata["doc"], f.name
    assert {"bleu", "ppl", "params", "train_time_s", "tokens_per_s", "steps", "target_tokens",
            "convergence", "unigram_ppl"} == set(RUN_COLUMNS)
    assert {"bleu", "ppl", "test_bleu", "params", "convergence"} == set(RunResult.keys("summary"))
    trial = set(RunResult.keys("trial"))
    assert {"bleu", "ppl", "test_bleu", "params", "train_time_s", "tokens_per_s", "steps", "target_tokens",
            "seed", "model", "preset", "corpus", "device", "precision", "sacrebleu_signature",
            "world_size"} <= trial
    assert {"steady_tokens_per_s", "startup_s", "first_step_s", "compiled", "compiled_graphs"} <= trial
    assert {"convergence", "convergence_reason", "dev_ppl_curve", "train_loss_curve", "warmup_steps",
            "unigram_ppl", "environment"} <= trial
    assert not any("dir" in key for key in RunResult.keys("trial"))  # no path of the training machine
    assert set(RUN_COLUMNS) <= trial  # a report column the trial does not store would stay empty


def test_failed_results_hold_only_what_was_measured():
    failed = RunResult(row="B1", preset="tiny", status="failed", reason="loss is NaN", steps=7, seed=1)
    assert failed.to_json() == {"schema": SCHEMA, "row": "B1", "preset": "tiny", "steps": 7, "seed": 1,
                                "status": "failed", "reason": "loss is NaN"}
    assert "reason" not in RunResult(status="complete").to_json()


def test_unreadable_results_are_none(tmp_path):
    assert read_results(tmp_path) is None
    (tmp_path / RESULTS).write_text("{not json")
    assert read_results(tmp_path) is None
