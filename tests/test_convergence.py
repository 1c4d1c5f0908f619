"""The convergence rule: on hand-made curves (each class and the order they are checked in) and
on the real curves of `ablate train` runs of a copy task: one that converges (1,500 steps, stored in
tests/data/converged_copy_run.json, written by `python tests/test_convergence.py`) and two trained
here (one stopped early, one pushed to diverge by its learning rate)."""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
from pathlib import Path

import pytest

from ablate.cli import main
from lightning_modules.convergence import INPUTS, ConvergenceRule, classify, classify_stored, read_curves

UNIGRAM = 100.0
FALLING = [(s, 40 - s / 10) for s in range(10, 101, 10)]  # training loss, steadily down


def dev(*points: tuple[int, float]) -> list[tuple[int, float]]:
    return list(points)


def test_plateau_is_converged_and_the_tail_is_measured_from_its_start():
    verdict = classify(dev((200, 30.0), (800, 10.0), (900, 9.95), (1000, 9.92)), FALLING, UNIGRAM, 100)
    assert verdict.label == "converged"
    assert verdict.tail_improvement == pytest.approx((10.0 - 9.92) / 10.0)  # from step 800 = 1000 × 0.8


def test_improving_by_the_tolerance_or_more_is_still_improving():
    assert classify(dev((800, 10.0), (1000, 9.89)), FALLING, UNIGRAM, 100).label == "still improving"  # 1.1%
    assert classify(dev((800, 10.0), (1000, 9.91)), FALLING, UNIGRAM, 100).label == "converged"  # 0.9%
    loose = ConvergenceRule(tolerance=0.05)
    assert classify(dev((800, 10.0), (1000, 9.6)), FALLING, UNIGRAM, 100, loose).label == "converged"


def test_rising_dev_ppl_counts_as_converged_with_its_reason():
    verdict = classify(dev((800, 10.0), (1000, 10.5)), FALLING, UNIGRAM, 100)
    assert verdict.label == "converged" and "rose 5.0%" in verdict.reason


def test_dev_ppl_spike_after_warmup_is_unstable_even_when_the_loss_barely_moves():
    # an H100 base run at twice the paper's peak rate (benchmarks/results/gpu-h100-2026-11-23):
    # its dev PPL rose 71% towards the unigram line while its training loss rose 8%
    h100 = classify(dev((599, 772.0), (1200, 1320.7)), [(499, 7.01), (799, 7.58), (1199, 7.52)],
                    1330.75, 1000)
    assert h100.label == "unstable" and "rose to 1321 at step 1,200 (best so far 772)" in h100.reason
    # the same rise inside warmup is normal; and 1.2 x the best is the line, not above it
    assert classify(dev((500, 10.0), (700, 12.5), (800, 9.0), (1000, 8.99)), FALLING, UNIGRAM,
                    700).label == "converged"
    assert classify(dev((700, 10.0), (800, 12.0), (1000, 11.99)), FALLING, UNIGRAM, 100).label == "converged"
    assert classify(dev((700, 10.0), (800, 12.1), (1000, 11.99)), FALLING, UNIGRAM, 100).label == "unstable"


def test_dev_ppl_rising_while_the_training_loss_falls_is_overfitting():
    # the cpu table's D1 (no dropout, 24,000 steps; reports/results/cpu-converged-2026-11-22), every
    # 3,000 steps: dev PPL bottoms out at step 6,000 and climbs; the training loss keeps falling
    d1_dev = dev((3000, 39.2), (6000, 35.0), (9000, 38.6), (12000, 44.1), (15000, 56.1), (18000, 83.8),
                 (21000, 111.4), (24000, 125.0))
    d1_loss = [(s, loss) for s, loss in zip(range(1000, 24001, 1000), (
        4.6, 4.0, 3.9, 3.8, 3.8, 3.7, 3.6, 3.5, 3.45, 3.4, 3.3, 3.2, 3.1, 3.0, 2.95, 2.85, 2.75, 2.65,
        2.55, 2.45, 2.4, 2.35, 2.3, 2.25))]
    verdict = classify(d1_dev, d1_loss, 8000.0, 1000)
    assert verdict.label == "overfitting", verdict.reason
    # the first crossing of 1.2 x the best, where it ended, and the loss means: over the evaluation
    # interval that ended at the best (rows 4,000-6,000: 3.767) and over the last 20% (20,000-24,000: 2.35)
    assert verdict.reason == ("dev PPL rose to 44.1 at step 12,000 (best so far 35) and ended at 125, "
                              "while the mean training loss fell 3.77 → 2.35")
    # the same dev curve with a training loss that stopped falling (within 1% of 3.767), or that
    # spiked: unstable; 1% is the line
    for level, label in ((3.74, "unstable"), (3.72, "overfitting")):
        flat = [(s, level if s > 6000 else loss) for s, loss in d1_loss]
        assert classify(d1_dev, flat, 8000.0, 1000).label == label, level
    spiked = [(s, 4.5 if s == 15000 else loss) for s, loss in d1_loss]  # 4.5 > 1.2 x 3.5
    assert classify(d1_dev, spiked, 8000.0, 1000).label == "unstable"
    # no training-loss row in either span: nothing says the loss fell, so unstable
    assert classify(dev((700, 10.0), (800, 12.1), (1000, 11.99)), FALLING, UNIGRAM, 100).label == "unstable"


def test_diverged_unstable_and_their_precedence():
    assert classify(dev((800, 10.0), (1000, math.nan)), FALLING, UNIGRAM, 100).label == "diverged"
    assert classify(dev((800, 10.0), (1000, 9.0)), [(10, math.inf)], UNIGRAM, 100).label == "diverged"
    assert classify(dev((800, 90.0), (1000, 100.0)), FALLING, UNIGRAM, 100).label == "diverged"  # = unigram
    # above the unigram line after warmup, then recovered: unstable
    assert classify(dev((300, 150.0), (800, 10.0), (1000, 9.9)), FALLING, UNIGRAM, 100).label == "unstable"
    # above it only during warmup: normal
    assert classify(dev((50, 150.0), (800, 10.0), (1000, 9.99)), FALLING, UNIGRAM, 100).label == "converged"
    spike = [(10, 6.0), (200, 3.0), (300, 3.7), (400, 2.0)]  # 3.7 > 1.2 × 3.0
    verdict = classify(dev((800, 10.0), (1000, 9.99)), spike, UNIGRAM, 100)
    assert verdict.label == "unstable" and "step 300" in verdict.reason
    assert classify(dev((800, 10.0), (1000, 9.99)), [(10, 6.0), (200, 3.0), (300, 3.5)], UNIGRAM,
                    100).label == "converged"  # 3.5 < 3.6: noise, not a spike
    # a run still in warmup, above the unigram line, is not called diverged
    assert classify(dev((20, 400.0), (40, 300.0)), FALLING, UNIGRAM, 100).label == "still improving"


def test_too_few_evaluations_is_unknown():
    assert classify([], FALLING, UNIGRAM, 100).label == "unknown"
    assert classify(dev((1000, 9.0)), FALLING, UNIGRAM, 100).label == "unknown"
    assert classify(dev((900, 9.5), (1000, 9.0)), FALLING, UNIGRAM, 100).label == "unknown"  # 900 > 800


def test_a_run_is_classified_from_the_inputs_it_stored_or_not_at_all():
    spiked = dev((200, 50.0), (400, 30.0), (600, 45.0), (800, 44.0), (1000, 44.0))
    falling = [(s, 5 - s / 500) for s in range(100, 1001, 100)]
    stored = {"dev_ppl_curve": [list(p) for p in spiked], "train_loss_curve": [list(p) for p in falling],
              "unigram_ppl": UNIGRAM, "warmup_steps": 100, "convergence": "unstable"}  # as JSON gives them back
    assert classify_stored(stored) == classify(spiked, falling, UNIGRAM, 100)
    assert classify_stored(stored).label == "overfitting"  # the inputs decide, not the class stored
    for key in INPUTS:  # a run stored before runs kept the rule's inputs: no class
        assert classify_stored({k: v for k, v in stored.items() if k != key}) is None


# ------------------------------------------------------------------------------- real runs

STORED = Path(__file__).parent / "data" / "converged_copy_run.json"
# the converging run: the cosine settles it (the rsqrt decay left dev PPL wandering 1.11-1.21 at the
# end); rows of 50 steps (10-step rows of the copy task's transition near step 400 reached 1.18-1.38x
# their best)
CONVERGING = ("--max-steps", "1500", "train.warmup_steps=100", "train.lr_scale=0.5", "train.lr_decay=cosine",
              "train.log_every_n_steps=50")


def write_copy_task(root: Path) -> list[str]:
    """A copy task (target = source) over 16 syllables: a tiny model masters it in seconds."""
    rng = random.Random(0)
    syllables = "ka lo mi nu pe ra si tu ve zo ba de fi go hu ja".split()
    args = []
    for split, n in (("train", 4000), ("valid", 200), ("test", 50)):
        text = "\n".join(" ".join(rng.choices(syllables, k=rng.randint(3, 8))) for _ in range(n)) + "\n"
        for side in ("src", "tgt"):
            (root / f"{split}.{side}").write_text(text)
            args += [f"--{split}-{side}", str(root / f"{split}.{side}")]
    return ["--data", "files", *args]


@pytest.fixture(scope="module")
def copy_task(tmp_path_factory) -> list[str]:
    return write_copy_task(tmp_path_factory.mktemp("copy"))


def train(copy_task: list[str], out: Path, *overrides: str) -> dict:
    """One thread: the run is in this process, whose torch thread count earlier tests may have set,
    and the trajectory depends on it (the same converging run, rsqrt decay, on 1 thread: 6.0% over
    its last 20%, 'still improving'; on 2: under 1%)."""
    code = main(["train", "--out", str(out), *copy_task, "--no-wandb", "model.n_layers=1", "model.d_model=32",
                 "model.d_ff=64", "model.n_heads=4", "model.dropout=0", "data.vocab_size=40",
                 "data.max_tokens=1000", "train.val_check_interval=50", "train.log_every_n_steps=10",
                 "train.threads=1", "train.progress_bar=false", "eval.decode_test=false", "eval.beam_size=1",
                 *overrides])
    assert code == 0
    return json.loads((out / "results.json").read_text())


def test_a_stored_converging_run_is_classified_converged():
    """The results.json of a real 1,500-step run (CONVERGING), stored: the rule as it is now reads
    its curves as converged, as the run itself did; it ended near the copy task's PPL of 1, far
    below the unigram line, and kept a training-loss row every 50 steps."""
    converged = json.loads(STORED.read_text())["results"]
    verdict = classify_stored(converged)
    assert verdict.label == converged["convergence"] == "converged", verdict.reason
    assert verdict.reason == converged["convergence_reason"]
    assert converged["steps"] == 1500 and converged["warmup_steps"] == 100
    assert converged["dev_ppl_curve"][-1][1] == pytest.approx(converged["ppl"], rel=1e-3)
    assert 1 < converged["ppl"] < 1.5 < 10 < converged["unigram_ppl"]
    assert len(converged["train_loss_curve"]) == 30


def test_real_runs_are_classified(copy_task, tmp_path):
    # The two runs below keep the paper's rsqrt decay, which does not depend on --max-steps: each is
    # the first steps of the longer run it replaced (300 and 200 steps), the same batches, draws
    # and dev PPL at each evaluation. Stopped at 200, dev PPL went 2.03 (step 150) -> 1.51 (step
    # 200) over the last 20%: 25% where 'converged' needs under 1%.
    early = train(copy_task, tmp_path / "early", "--max-steps", "200", "train.warmup_steps=100",
                  "train.lr_scale=0.5")
    assert early["convergence"] == "still improving", early["convergence_reason"]
    assert early["dev_ppl_curve"][-1][1] == pytest.approx(early["ppl"], rel=1e-3)
    assert 1 < early["ppl"] < 2 < 10 < early["unigram_ppl"]  # it learns the copy task
    # what the rule read is stored with the class, and gives that class again
    dev_curve, losses = read_curves(tmp_path / "early" / "logs")
    assert early["train_loss_curve"] == [[s, round(loss, 4)] for s, loss in losses] and len(losses) == 20
    assert [s for s, _ in early["dev_ppl_curve"]] == [s for s, _ in dev_curve]
    assert early["warmup_steps"] == 100
    assert classify_stored(early).label == "still improving"
    assert "convergence_rule" not in early and "run_dir" not in early

    # at 30x the learning rate dev PPL was 5e21 at step 20 and still 33,002 at step 100, against a
    # unigram PPL of 16.5: diverged by step 100 (the 200-step run ended at 297)
    blown = train(copy_task, tmp_path / "blown", "--max-steps", "100", "train.warmup_steps=10",
                  "train.lr_scale=30", "model.n_layers=2", "model.dropout=0.1",
                  "train.val_check_interval=20")
    assert blown["convergence"] == "diverged", blown["convergence_reason"]
    assert classify_stored(blown).reason == blown["convergence_reason"]
    metrics = (tmp_path / "early" / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert "train/grad_norm" in metrics  # gradient norm is logged


if __name__ == "__main__":  # python tests/test_convergence.py: train CONVERGING and store its results
    with tempfile.TemporaryDirectory() as scratch:
        results = train(write_copy_task(Path(scratch)), Path(scratch) / "run", *CONVERGING)
    STORED.write_text(json.dumps({
        "note": "results.json of a real `ablate train` run of tests/test_convergence.py's copy task with "
                "CONVERGING, written by `python tests/test_convergence.py`; test_a_stored_converging_run_is_"
                "classified_converged classifies its curves by the rule as it is now",
        "results": results}, indent=1, ensure_ascii=False) + "\n")
    print(f"{STORED}: {results['convergence']} ({results['convergence_reason']})", file=sys.stderr)
