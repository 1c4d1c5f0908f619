"""One schema version (`foundation.schema`): config.yaml, results.json and the table record
each carry it; a file of each older shape reads, through its reader, as the current one; a newer
version is refused in one line (as a command: test_bad_input.py); upgrading is idempotent; the
committed archives were migrated once and are at the current version."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ablations.resolve import resolve
from lightning_modules.config import TransformerConfig, to_yaml
from foundation.errors import UserError
from lightning_modules.run.results import RESULTS, RunResult, read_results
from foundation.rundir import CONFIG, saved_config
from foundation.schema import KEY, SCHEMA, STEPS, upgrade
from tables.archive import IDENTITY, stored_identity
from tables.plan import Table3Plan, queue

REPO = Path(__file__).resolve().parent.parent


def oldest(kind: str) -> dict:
    """A file of `kind` as version 0 (no version key) wrote it, in its oldest shape."""
    if kind == "config":  # the tokenizer's keys and every head size filled in (B1 sets d_k 4; d_v was d_model / h)
        old = {k: v for k, v in yaml.safe_load(to_yaml(resolve("tiny", "B1"))).items() if k != KEY}
        old["model"].update({"d_k": 4, "d_v": 16, "vocab_size": 3987, "pad_id": 0})
        return old
    if kind == "results":  # fields since removed; none of those added since
        return {"row": "base", "ppl": 12.5, "bleu": 3.1, "status": "complete", "run_dir": "runs/base-s1",
                "convergence_rule": "first rule"}
    return {"kind": "table3", "preset": "tiny", "runs": {"base-s1": {"row": "base"}}}


def test_a_config_yaml_of_version_0_reads_as_it_was_meant(tmp_path: Path):
    (tmp_path / CONFIG).write_text(yaml.safe_dump(oldest("config")))
    saved = saved_config(tmp_path)
    assert KEY not in saved and "vocab_size" not in saved["model"] and (saved["model"]["d_k"], saved["model"]["d_v"]) == (4, None)
    m = resolve("tiny", "base", config_file=tmp_path / CONFIG, overrides=["d_model=256"]).model
    assert (m.d_k, m.d_v) == (4, 32)  # B1's explicit d_k kept, the derived d_v derived again
    assert m.vocab_size == TransformerConfig.vocab_size  # the file's tokenizer size is not a choice


def test_a_results_json_of_version_0_reads_as_the_current_one(tmp_path: Path):
    (tmp_path / RESULTS).write_text(json.dumps(oldest("results")))
    result = read_results(tmp_path)
    assert result.ppl == 12.5 and result.complete and result.steady_tokens_per_s is None  # a newer key: None
    written = result.to_json()
    assert written[KEY] == SCHEMA and "run_dir" not in written and "convergence_rule" not in written
    (tmp_path / RESULTS).write_text(json.dumps({**result.to_json(), "a_key_of_no_field": 1}))
    with pytest.raises(UserError, match=rf"{RESULTS}: unknown keys a_key_of_no_field"):
        read_results(tmp_path)


def test_a_table_record_without_its_runs_cannot_be_upgraded_and_is_refused_in_one_line(tmp_path: Path):
    """The oldest record (a `recipe`, no runs' configurations) cannot be compared with a table: the
    study and the archive that hold one are refused, naming it."""
    import optuna

    plan = Table3Plan(study="t", storage=f"sqlite:///{tmp_path}/t3.db", preset="tiny", rows=["base"],
                      seeds=[1], runs_dir=str(tmp_path / "runs"), overrides=[])
    study, _ = queue(plan)
    assert study.user_attrs[KEY] == SCHEMA
    older = {k: v for k, v in study.user_attrs.items() if k not in ("runs", KEY)}
    old_study = optuna.create_study(study_name="old", storage=plan.storage)
    for key, value in older.items():
        old_study.set_user_attr(key, value)
    with pytest.raises(UserError, match=r"^study 'old' is a Table 3 stored by an older version, without its runs' "
                                        r"configurations: .*use another --study or --archive$"):
        queue(replace(plan, study="old"))
    (tmp_path / IDENTITY).write_text(json.dumps(older))
    with pytest.raises(UserError, match=rf"^{tmp_path / IDENTITY} is a Table 3 stored by an older version"):
        stored_identity(tmp_path)


def test_a_newer_version_is_refused_in_one_line_by_every_reader(tmp_path: Path):
    newer = SCHEMA + 1
    (tmp_path / CONFIG).write_text(yaml.safe_dump({KEY: newer, "row": "base"}))
    (tmp_path / RESULTS).write_text(json.dumps({KEY: newer, "row": "base"}))
    (tmp_path / IDENTITY).write_text(json.dumps({KEY: newer, "kind": "table3"}))
    for read in (saved_config, lambda d: resolve("tiny", config_file=d / CONFIG), read_results, stored_identity):
        with pytest.raises(UserError, match=rf"is of schema version {newer}, newer than this version of ablate "
                                            rf"reads \({SCHEMA}\); read it with the newer ablate that wrote it$"):
            read(tmp_path)
    for bad in ("two", -1, True):
        with pytest.raises(UserError, match="is not a schema version"):
            upgrade("results", {KEY: bad}, "results.json")


@pytest.mark.parametrize("kind", sorted(STEPS))
def test_upgrading_is_idempotent_and_what_is_written_is_current(kind: str):
    assert len(STEPS[kind]) == SCHEMA  # one step from each older version
    once = upgrade(kind, oldest(kind), "file")
    assert once[KEY] == SCHEMA and upgrade(kind, once, "file") == once
    assert yaml.safe_load(to_yaml(resolve("tiny", "base")))[KEY] == SCHEMA
    assert RunResult(status="complete").to_json()[KEY] == SCHEMA


def test_the_committed_archives_are_at_the_current_version():
    """Migrated once, by `upgrade`: each file reads as it is (a table's sitting rewrites its
    table3.json as the table writes it now, so it must be current for the archive to stay as committed)."""
    found = [*REPO.glob("reports/results/*/archive/table3.json"), *REPO.glob("*/results/*/archive/*/config.yaml"),
             *REPO.glob("*/results/*/archive/*/results.json")]
    assert len(found) > 100
    for path in found:
        doc = yaml.safe_load(path.read_text()) if path.suffix == ".yaml" else json.loads(path.read_text())
        kind = "table" if path.name == IDENTITY else "config" if path.suffix == ".yaml" else "results"
        assert doc[KEY] == SCHEMA and upgrade(kind, doc, str(path)) == doc, path
