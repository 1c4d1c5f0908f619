"""`RunResult`: one schema for results.json, a trial's attributes, the report's columns and the W&B
summary; each field says where it goes, so adding a metric is one field here."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from foundation.errors import UserError
from foundation.records import STRICT, Finite, Pair, validated
from foundation.schema import read, stamped

RESULTS = "results.json"


def _f(doc: str, *, trial: bool = False, column: bool = False, summary: bool = False) -> Any:
    """A result field, None unless set."""
    return field(default=None, metadata={"doc": doc, "trial": trial, "column": column, "summary": summary})


@dataclass
class RunResult:
    """One run's results (results.json); `status` complete or failed (then `reason`)."""

    row: str | None = _f("Table 3 row (or the row the run's configuration started from)")
    preset: str | None = _f("scale preset", trial=True)
    corpus: str | None = _f("corpus name (data.corpus)", trial=True)
    params: int | None = _f("parameters of the model as built", trial=True, column=True, summary=True)
    bleu: Finite | None = _f("dev BLEU (sacreBLEU, beam search)", trial=True, column=True, summary=True)
    ppl: Finite | None = _f("dev perplexity per wordpiece", trial=True, column=True, summary=True)
    test_bleu: Finite | None = _f("test BLEU (None: the test split not decoded)", trial=True, summary=True)
    sacrebleu_signature: str | None = _f("sacreBLEU's signature of the dev score", trial=True)
    train_time_s: Finite | None = _f("training seconds (no validation or stops)", trial=True, column=True)
    tokens_per_s: Finite | None = _f("target tokens per training second", trial=True, column=True)
    steady_tokens_per_s: Finite | None = _f("target tokens/s after the first log window", trial=True)
    startup_s: Finite | None = _f("process start to the first training step, seconds", trial=True)
    startup: list[dict[str, Any]] | None = _f("where startup_s went, [{part, s}]", trial=True)
    first_step_s: Finite | None = _f("the first training step (compilation included), seconds", trial=True)
    compiled: bool | None = _f("whether the training step ran through torch.compile", trial=True)
    compiled_graphs: int | None = _f("graphs torch.compile built (a recompilation storm shows)", trial=True)
    recompiled_because: list[str] | None = _f("the guards that failed, as TORCH_LOGS=recompiles prints them")
    target_tokens: int | None = _f("target tokens trained on", trial=True, column=True)
    steps: int | None = _f("optimizer steps", trial=True, column=True)
    seed: int | None = _f("random seed (train.seed)", trial=True)
    beam_size: int | None = _f("beam size of the dev/test decoding")
    length_penalty: Finite | None = _f("GNMT length penalty alpha of the decoding")
    padding_share: Finite | None = _f("share of padding in the training batches")
    data: dict[str, Any] | None = _f("corpus and batching statistics")
    model: dict[str, Any] | None = _f("the architecture as built (TransformerConfig)", trial=True)
    precision: str | None = _f("Lightning precision", trial=True)
    device: str | None = _f("GPU name or CPU", trial=True)
    environment: dict[str, Any] | None = _f("what a rerun must match to expect the same numbers", trial=True)
    world_size: int | None = _f("processes (DDP ranks)", trial=True)
    host: str | None = _f("host name")
    group: str | None = _f("group of runs (the sweep's study, else the row)")
    convergence: str | None = _f("the run's own convergence class (a report classifies again from the "
                                 "inputs below)", trial=True, column=True, summary=True)
    convergence_reason: str | None = _f("the numbers behind the convergence class", trial=True)
    # the convergence rule's inputs
    dev_ppl_curve: list[Pair] | None = _f("[step, dev PPL] at every validation", trial=True)
    train_loss_curve: list[Pair] | None = _f("[step, window-mean training loss] per log window", trial=True)
    warmup_steps: int | None = _f("learning-rate warmup steps", trial=True)
    unigram_ppl: Finite | None = _f("perplexity of the training targets' unigrams", trial=True, column=True)
    status: str | None = _f("complete or failed")
    reason: str | None = _f("why a failed run failed (e.g. a NaN loss)")

    __pydantic_config__ = STRICT  # how `validated` reads one back (`foundation.records`)

    @property
    def complete(self) -> bool:
        """Whether the run finished and was scored (a failed run has `reason` instead)."""
        return self.status == "complete"

    def to_json(self) -> dict[str, Any]:
        """results.json's content; a failed run leaves out what it never measured."""
        values = asdict(self)
        if self.status == "failed":
            return stamped({k: v for k, v in values.items() if v is not None})
        return stamped({k: v for k, v in values.items() if k != "reason" or v is not None})

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = RESULTS) -> "RunResult":
        """From results.json of any version up to the current one (a key of no field: one line)."""
        data = read("results", data, source)
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise UserError(f"{source}: unknown keys {', '.join(unknown)}; not a run's results.json")
        return validated(cls, data, source)

    @classmethod
    def keys(cls, where: str) -> tuple[str, ...]:
        """The fields that go to `where`: "trial", "column" or "summary"."""
        return tuple(f.name for f in fields(cls) if f.metadata[where])

    def select(self, where: str) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.keys(where)}


def read_results(out: Path) -> RunResult | None:
    """The run directory's results.json, or None if there is none (or it is not JSON)."""
    path = Path(out) / RESULTS
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return RunResult.from_json(data, str(path)) if isinstance(data, dict) else None
