"""One schema version for `config.yaml`, `results.json` and a table's record (docs/configuration.md),
raised whenever one changes in a way an older reader would misread. Every reader calls `upgrade` (or
`read`): a newer version is one line, an older one goes through `STEPS[kind][v]`, the only code that
looks at a version.

0 -> 1. config.yaml: the oldest held the tokenizer's model.vocab_size and pad_id and every head
size; such a file loses them, and a d_k or d_v equal to its d_model / h reads as derived (None), as
it was when written. results.json: `run_dir` and `convergence_rule` (fields since removed) go.
Table record: one without `runs` (each run's configuration; the oldest kept a `recipe`) cannot be
compared with a table, and is refused."""

from __future__ import annotations

from typing import Any

from foundation.errors import UserError

SCHEMA = 1
KEY = "schema"


def _config_0(doc: dict[str, Any], source: str) -> dict[str, Any]:
    model = doc.get("model")
    if not (isinstance(model, dict) and ("vocab_size" in model or "pad_id" in model)):
        return doc
    model = {k: v for k, v in model.items() if k not in ("vocab_size", "pad_id")}
    d_model, heads = model.get("d_model"), model.get("n_heads")
    if isinstance(d_model, int) and isinstance(heads, int) and heads > 0 and d_model % heads == 0:
        model.update({key: None for key in ("d_k", "d_v") if model.get(key) == d_model // heads})
    return {**doc, "model": model}


def _results_0(doc: dict[str, Any], source: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in ("run_dir", "convergence_rule")}


def _table_0(doc: dict[str, Any], source: str) -> dict[str, Any]:
    if not isinstance(doc.get("runs"), dict) or not doc["runs"]:
        raise UserError(f"{source} is a Table 3 stored by an older version, without its runs' configurations: "
                        f"it cannot be compared with this table; use another --study or --archive")
    return doc


STEPS = {"config": [_config_0], "results": [_results_0], "table": [_table_0]}


def stamped(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` carrying the current version, first."""
    return {KEY: SCHEMA, **{k: v for k, v in doc.items() if k != KEY}}


def upgrade(kind: str, doc: dict[str, Any], source: str) -> dict[str, Any]:
    """`doc` (kind "config", "results" or "table") in the current shape, stamped; `source` names it."""
    version = doc.get(KEY, 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise UserError(f"{source}: {KEY} {version!r} is not a schema version (a whole number up to {SCHEMA})")
    if version > SCHEMA:
        raise UserError(f"{source} is of schema version {version}, newer than this version of ablate reads "
                        f"({SCHEMA}); read it with the newer ablate that wrote it")
    for step in STEPS[kind][version:]:
        doc = step(doc, source)
    return stamped(doc)


def read(kind: str, doc: dict[str, Any], source: str) -> dict[str, Any]:
    """`upgrade`, less the version key: the document as the current version's readers take it."""
    return {k: v for k, v in upgrade(kind, doc, source).items() if k != KEY}
