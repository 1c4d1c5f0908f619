"""The benchmark command runs (tiny sizes) and writes its JSON and markdown; the numbers
themselves are measured by `python -m benchmarks`, not asserted here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`python -m benchmarks ARGS` run in this process (its 6 s of imports already paid): its exit
    status and what it printed on stderr (with capfd, its child processes' too). The torch thread count it sets is put back after it."""
    import torch

    from benchmarks.__main__ import main

    threads = torch.get_num_threads()
    try:
        code = main(list(args))
    finally:
        torch.set_num_threads(threads)
    return code, capsys.readouterr().err


def test_quick_benchmarks_write_json_and_markdown(tmp_path: Path, capsys):
    code, err = bench_here(capsys, "--quick", "--threads", "1", "--only", "padding,scaling", "--out", str(tmp_path),
                           "--cache-dir", str(tmp_path / "cache"), "--multi30k-dir", str(tmp_path / "absent"))
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["benchmarks"]) == {"padding", "scaling"}
    assert data["machine"]["torch"] and data["targets"]
    padding = [t for t in data["targets"] if t["benchmark"] == "padding"]
    assert padding and all(0 <= t["value"] <= 1 for t in padding)
    assert all(t["met"] for t in padding if "ding" in t["target"].lower())  # our bucketing: ≤ 5% padding
    md = (tmp_path / "results.md").read_text()
    assert md.startswith("# Benchmarks") and "|" in md


def test_gpu_round_quick_runs_every_variant_and_each_agrees_with_eager(tmp_path: Path):
    """The GPU round's CPU mode (tiny dims, fp32; compiled variants through dynamo + AOTAutograd):
    every code path of the CUDA command but CUDA's kernels, so a crash shows here first; run as on
    the GPU machines, which lack optuna, omegaconf and wandb (made unimportable here)."""
    from benchmarks.gpu_round import NOISE_FLOOR, VARIANTS, reference

    lacking = ("import sys, runpy; sys.modules.update(dict.fromkeys(('optuna', 'omegaconf', 'wandb'))); "
               "runpy.run_module('benchmarks', run_name='__main__', alter_sys=True)")
    result = subprocess.run([sys.executable, "-c", lacking, "--quick", "--threads", "1", "--only", "gpu_round",
                             "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((tmp_path / "gpu_round.json").read_text())  # written as it goes
    section = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["gpu_round"]
    assert saved["rows"] == section["rows"]
    ran = {row["variant"] for row in section["rows"] if row.get("tokens/s")}
    assert {name for name, o in VARIANTS.items() if not o.get("train.compile")} <= ran  # every eager one
    assert "compiled, buckets 8, CUDA graphs" in ran and any(name.startswith("compiled, all") for name in ran)
    assert reference("compiled, buckets 8, CUDA graphs") == "eager, buckets 8" and reference("eager") is None
    assert not any(row.get("note", "").startswith("error") for row in section["rows"])
    for row in section["rows"]:
        if reference(row["variant"]) is not None and row["variant"] != NOISE_FLOOR:
            assert row["agrees"] is True and row["loss Δ"] <= 1e-3, row
        if row["variant"].startswith("compiled"):
            assert row["graphs"] == 1 and row["recompiled because"] == [], row  # one graph for every batch shape
        elif row.get("tokens/s"):
            assert row["graphs"] == 0 and row["recompiled because"] is None, row  # as results.json: not compiled
    assert (tmp_path / "gpu_round.md").read_text().startswith("## GPU round")


def test_gpu_round_batches_hold_source_widths_of_both_alignments():
    """A compiled variant must meet a source width divisible by 8 and one not, or a guard on the
    width (Inductor's alignment check) cannot show in its graphs column (the 2026-11-27 H200 round's
    12 widths held none divisible by 8)."""
    from benchmarks.gpu_round import CASES, wmt_like_batches

    for case in (CASES["wmt-base-37k"], CASES["tiny"]):
        for size in case.tokens:
            batches = wmt_like_batches(case.vocab, size, case.batches, 1, case.pool, case.max_len)
            widths = [batch["src"].shape[1] for batch in batches]
            assert len(widths) == case.batches and {w % 8 == 0 for w in widths} == {True, False}, widths


def test_gpu_round_measures_the_steps_named_in_their_order_skips_what_its_budget_leaves_no_room_for(tmp_path: Path,
                                                                                                 capsys):
    """--steps: the (case, variant) pairs named, in that order, nothing else; --budget-s: a budget
    that fits the eager variants but no compilation, whose rows say why (one process for both: the
    eager variants are the steps named that run)."""
    steps = "tiny:eager;tiny:compiled;tiny:eager, fused QKV;tiny:compiled, buckets 8"
    # 110 s: an eager variant is given ~25 s (+10 s profiled), a first compilation ~105 s (+10 s)
    code, err = bench_here(capsys, "--quick", "--threads", "1", "--only", "gpu_round", "--steps", steps,
                           "--budget-s", "110", "--profile", "--out", str(tmp_path))
    assert code == 0, err[-3000:]
    saved = json.loads((tmp_path / "gpu_round.json").read_text())
    rows = saved["rows"]
    assert [row["variant"] for row in rows] == ["eager", "eager", "compiled", "eager, fused QKV", "eager, fused QKV",
                                                "compiled, buckets 8"]
    compiled = [row for row in rows if row["variant"].startswith("compiled")]
    assert all(row["note"].startswith("time budget:") and "tokens/s" not in row for row in compiled), compiled
    ran = [row for row in rows if not row["variant"].startswith("compiled")]
    assert all(row["tokens/s"] > 0 for row in ran) and ran[2]["agrees"] is True
    # --profile: each variant's pass per batch size, its groups' shares summing to one, its top ops on disk
    for variant in ("eager", "eager, fused QKV"):
        for size in ("600", "300"):
            profile = saved["data"]["tiny"]["results"][variant]["profile"][size]
            assert abs(sum(profile["shares"].values()) - 1) < 1e-6 and profile["busy_ms_per_step"] > 0
            assert profile["shares"]["matmul"] > 0 and profile["shares"]["attention"] > 0, profile
            table = (tmp_path / "profiles" / f"tiny-{variant.replace(', ', '-').replace(' ', '-').lower()}-{size}.txt")
            assert "aten::mm" in table.read_text()
    assert "## Where the step's time goes" in (tmp_path / "results.md").read_text()


def test_a_variant_whose_own_process_crashes_is_a_row_and_the_round_goes_on(tmp_path: Path, capfd, monkeypatch):
    """CUDA graphs' variant runs in a process of its own (`ISOLATED`): made to crash there below
    Python (a real SIGSEGV at its compilation, the only one of these steps that compiles), it becomes
    a row saying how its process ended, and the round measures the variants after it."""
    from benchmarks.gpu_round import BUCKETS, ISOLATED, VARIANTS

    assert BUCKETS in ISOLATED and ISOLATED <= set(VARIANTS)
    monkeypatch.setenv("ABLATE_FAULT", "compile:SIGSEGV")
    code, err = bench_here(capfd, "--quick", "--threads", "1", "--only", "gpu_round", "--steps",
                           f"tiny:eager, buckets 8;tiny:{BUCKETS};tiny:eager", "--out", str(tmp_path))
    assert code == 0, err[-3000:]
    rows = json.loads((tmp_path / "gpu_round.json").read_text())["rows"]
    crashed = [row for row in rows if row["variant"] == BUCKETS]
    assert [row["note"] for row in crashed] == ["error: its own process ended with signal SIGSEGV and no result "
                                                "(its stack, if any, is in this command's log)"], crashed
    assert [row["variant"] for row in rows if row.get("tokens/s")] == ["eager, buckets 8"] * 2 + ["eager"] * 2
    assert "Fatal Python error: Segmentation fault" in err  # faulthandler's, from that process's stderr


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What `python -m benchmarks ARGS` prints on stderr when its arguments refuse it: parse_args, the
    command's first step, ends it with argparse's exit (status 2, a usage line and one error line,
    no traceback) before any benchmark runs. Checked in the pytest process (no 7 s of imports)."""
    from benchmarks.__main__ import parse_args

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        parse_args(list(args))
    assert exit_.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err, (out, err)
    return err


def test_gpu_round_refuses_unknown_steps_in_one_line(tmp_path: Path, capsys):
    """A wrong --steps name: one line naming it, and no --out folder made."""
    err = refused(capsys, "--only", "gpu_round", "--steps", "tiny:eager;tiny:fast", "--out", str(tmp_path / "x"))
    assert "tiny:fast" in err.strip().splitlines()[-1]
    assert not (tmp_path / "x").exists()


def test_end_to_end_steps_are_checked_against_its_cases_and_runs(tmp_path: Path, capsys):
    """end_to_end's --steps name CASE:RUN pairs of its own; steps with both stepped benchmarks in
    --only, whose steps they would be is unclear: each one line, and no --out folder made."""
    err = refused(capsys, "--only", "end_to_end", "--steps", "quick:compiled;quick:fast", "--out", str(tmp_path / "x"))
    assert "quick:fast" in err.strip().splitlines()[-1] and "quick:compiled;" not in err
    err = refused(capsys, "--only", "end_to_end,gpu_round", "--steps", "tiny:eager", "--out", str(tmp_path / "x"))
    assert "name one of gpu_round and end_to_end" in err.strip().splitlines()[-1]
    assert not (tmp_path / "x").exists()
    from benchmarks.__main__ import parse_args

    assert parse_args(["--only", "end_to_end", "--steps", "wmt-big-37k:compiled", "--out",
                       str(tmp_path / "y")]).steps == (("wmt-big-37k", "compiled"),)


def test_precisions_side_by_side_time_every_model_in_each_and_read_a_step_against_a_matmul_alone(
        tmp_path: Path, capsys):
    """`--precision fp32,bf16` (quick train): every model's step in both precisions in one process, the
    bf16 rows' speed over fp32's, a square matrix product alone in each precision, a step's FLOP/s as a
    share of it, and the bf16/fp32 target; a precision it does not know is one line, no --out folder."""
    code, err = bench_here(capsys, "--quick", "--threads", "1", "--reps", "1", "--precision", "fp32,bf16",
                           "--only", "train", "--out", str(tmp_path), "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, err[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["machine"]["precision"] == "fp32,bf16" and data["machine"]["cpu_capability"]
    train = data["benchmarks"]["train"]
    assert [r["precision"] for r in train["more"][0]["rows"]] == ["fp32", "bf16"]
    rows = {(r["size"], r["model"], r["precision"]): r for r in train["rows"]}
    assert {p for _, _, p in rows} == {"fp32", "bf16"} and len(rows) == len(train["rows"])
    for (size, model, precision), r in rows.items():
        assert r["of matmul"] > 0 and (r["vs fp32"] is None) == (precision == "fp32")
        assert r["vs fp32"] is None or r["vs fp32"] == pytest.approx(
            r["tgt tokens/s"] / rows[size, model, "fp32"]["tgt tokens/s"])
    assert [t["goal"] for t in data["targets"] if "bf16/fp32" in t["target"]] == ["≥ 1.8", "≥ 1.3"]
    err = refused(capsys, "--precision", "fp32,fp16", "--out", str(tmp_path / "x"))
    assert "--precision fp32,fp16" in err.strip().splitlines()[-1] and not (tmp_path / "x").exists()


def test_an_out_folder_that_cannot_be_made_is_one_line_before_any_benchmark(tmp_path: Path, capsys):
    (tmp_path / "a-file").write_text("")
    err = refused(capsys, "--quick", "--only", "padding", "--out", str(tmp_path / "a-file" / "out"))
    assert err.strip().splitlines()[-1].endswith("cannot make this folder (Not a directory)")


def test_attention_shapes_quick_times_every_kernel_on_shapes_no_kernel_before_it_met(tmp_path: Path, capsys):
    code, err = bench_here(capsys, "--quick", "--threads", "1", "--only", "attention_shapes", "--out", str(tmp_path))
    assert code == 0, err[-2000:]
    from lightning_modules.config import ATTENTION_BACKENDS
    section = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["attention_shapes"]
    works = {(row["kernel"], re.sub(r", \d+ (tokens|rows)$", "", row["work"])) for row in section["rows"]}
    assert works == {(k, w) for k in ATTENTION_BACKENDS
                     for w in ("train step", "decode step, growing caches", "decode step, fixed-size caches")}
    train = {row["kernel"]: row for row in section["rows"] if row["work"].startswith("train")}
    assert train["auto"]["vs auto"] == 1.0 and all(row["first visit ms"] > 0 for row in train.values())
    counts = section["more"][0]["rows"][0]
    assert counts["shapes"] <= counts["batches"] and counts["cross"] == counts["shapes"]


def test_an_attention_kernel_that_fails_is_a_row_and_the_others_are_kept(monkeypatch, tmp_path: Path):
    import torch

    from benchmarks import attention_shapes
    from benchmarks.common import Settings

    monkeypatch.setattr(attention_shapes, "KERNELS", ("auto", "nope"))
    settings = Settings(device=torch.device("cpu"), precision="fp32", reps=None, quick=True,
                        cache_dir=tmp_path, multi30k_dir=None, out=tmp_path)
    section = attention_shapes.run(settings)
    assert [row["kernel"] for row in section.rows] == ["auto"] * 3 + ["nope"]
    assert section.rows[-1]["work"] == ("failed: UserError: model.attention_backend must be one of auto, math, "
                                        "flash, efficient, cudnn; got 'nope'")
    assert section.targets[0]["value"] == 0.0  # auto against itself
    assert "| nope | failed: UserError" in (tmp_path / "attention_shapes.md").read_text()


def test_a_second_epoch_of_token_buckets_meets_no_batch_shape_the_first_did_not():
    """What attention_shapes' estimate rests on: ties regroup every epoch, the batch shapes stay."""
    import numpy as np
    from lightning_modules.data.batching import TokenBucketBatchSampler
    from lightning_modules.data.batching import batch_shapes
    from benchmarks.attention_shapes import shape_counts
    rng = np.random.default_rng(0)
    src = rng.integers(1, 60, 5000)
    tgt = np.clip(src + rng.integers(-5, 6, 5000), 1, None)
    sampler = TokenBucketBatchSampler(src, tgt, 800, shuffle=True, seed=3, num_replicas=1, rank=0)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = sampler.global_batches()
        epochs.append((sorted(batch_shapes(batches, src, tgt)), sorted(map(tuple, map(sorted, batches)))))
    assert epochs[0][0] == epochs[1][0] == epochs[2][0]  # the same shapes ...
    assert epochs[0][1] != epochs[1][1]  # ... of other sentences
    counts = shape_counts(800, 5000, seed=0, max_len=60)
    assert counts["shapes"] < counts["batches"] and counts["encoder self"] <= counts["shapes"]


def test_profile_groups_name_the_kernels_of_real_gpu_profiles():
    """Kernel names from the H100 profiles committed under benchmarks/results/ (eager and compiled
    base steps), each in the group a reader would put it in."""
    from benchmarks.gpu_round import time_group

    assert [time_group(name) for name in [
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "aten::mm",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26",
        "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>", "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
        "triton_per_fused__to_copy_add_native_dropout_backward_native_layer_norm_backward_3",
        "triton_red_fused__log_softmax__log_softmax_backward_data_2",
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
        "aten::native_layer_norm_backward", "aten::transpose"]] == [
        "matmul", "matmul", "matmul", "attention", "attention", "attention", "fused (Triton)", "loss", "loss",
        "cast, copy, fill", "elementwise", "optimizer", "norm", "other"]


def test_a_profiler_that_fails_costs_the_profile_not_the_measurement(monkeypatch, tmp_path: Path):
    """CUPTI can be missing on a GPU machine: the variant keeps its timed figures, and the profile
    table says why it has no row of shares."""
    import time

    import torch

    from benchmarks import gpu_round
    from benchmarks.common import Settings

    def no_cupti(*args, **kwargs):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED\nmore")

    monkeypatch.setattr(gpu_round, "profile_pass", no_cupti)
    settings = Settings(device=torch.device("cpu"), precision="fp32", reps=None, quick=True,
                        cache_dir=tmp_path, multi30k_dir=None, profile=True)
    case = gpu_round.CASES["tiny"]
    result = gpu_round.run_variant(case, "eager", gpu_round.case_data(case, settings), settings,
                                   time.perf_counter() + 600, {})
    assert all(result[size]["tokens_per_s"] > 0 for size in case.tokens)
    assert result["profile_error"] == "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
    assert gpu_round._profile_rows(case, "eager", result) == [
        {"case": "tiny", "variant": "eager", "top kernel": "profile failed: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}]


def test_a_gpu_round_variant_that_fails_is_a_row_with_its_error(monkeypatch, tmp_path: Path):
    import time

    import torch

    from benchmarks import gpu_round
    from benchmarks.common import Settings

    monkeypatch.setitem(gpu_round.VARIANTS, "eager, no such kernel", {"model.attention_backend": "nope"})
    settings = Settings(device=torch.device("cpu"), precision="fp32", reps=None, quick=True,
                        cache_dir=tmp_path, multi30k_dir=None)
    case = gpu_round.CASES["tiny"]
    data = gpu_round.case_data(case, settings)
    result = gpu_round.run_variant(case, "eager, no such kernel", data, settings, time.perf_counter() + 600, {})
    assert result == {"error": "UserError: model.attention_backend must be one of auto, math, flash, efficient, "
                               "cudnn; got 'nope'"}
    assert gpu_round._rows(case, "eager, no such kernel", result, None, 1e-3) == [
        {"case": "tiny", "variant": "eager, no such kernel", "note": f"error: {result['error']}"}]


STEPS = ["end_to_end", "attention_shapes", "test_gpu", "generation", "gpu_round", "startup", "test_gpu_sync",
         "profile"]  # its priority order


def gpu_session(out: Path, seconds: int) -> subprocess.CompletedProcess:
    """`benchmarks/gpu_session.sh` in its CPU mode, with this interpreter as its `python3`."""
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "benchmarks/gpu_session.sh", str(seconds)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=seconds + 120)


def test_gpu_session_skips_the_steps_its_time_leaves_no_room_for(tmp_path: Path):
    result = gpu_session(tmp_path, 40)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert len(lines) == len(STEPS) and all(re.fullmatch(rf"{name}: skipped, \d+ s left", line) for name, line in
                                   zip(STEPS, lines)), lines
    assert (tmp_path / "device.txt").read_text().startswith("no GPU\ntorch ")
    assert tarfile.open(tmp_path / "session.tgz").getnames() == ["."]


@pytest.mark.slow  # every step at tiny sizes (~4 minutes on 2 busy cores)
def test_gpu_session_runs_every_step_on_cpu_and_brings_back_few_files(tmp_path: Path):
    """The script a GPU session runs, end to end at tiny sizes: each step exits 0, the end-to-end
    figure beside its bare step, the profile and the variants are in its archive, and $OUT holds no
    more files than the device tool brings back."""
    result = gpu_session(tmp_path, 600)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == STEPS
    assert all(": exit 0 in " in line for line in summary), summary
    with tarfile.open(tmp_path / "session.tgz") as tar:
        profile = json.load(tar.extractfile("./profile/gpu_round.json"))
        rest = json.load(tar.extractfile("./gpu_round/gpu_round.json"))
        startup = json.load(tar.extractfile("./startup/results.json"))["benchmarks"]["startup"]
        assert "./generation/results.json" in tar.getnames() and "./test_gpu.log" in tar.getnames()
        assert "./test_gpu_sync.log" in tar.getnames()
        shapes = json.load(tar.extractfile("./attention_shapes/results.json"))["benchmarks"]["attention_shapes"]
        e2e = json.load(tar.extractfile("./end_to_end/results.json"))["benchmarks"]["end_to_end"]
    # the compiled run and the compiled bare step at the same batch size, nothing else
    assert [(row["what"], row["compiled"], row["tokens/batch"]) for row in e2e["rows"]] == [
        ("ablate train (compiled)", True, 1500), ("bare step", True, 1500)], e2e["rows"]
    assert all(row["tokens/s"] > 0 for row in e2e["rows"]) and (tmp_path / "end_to_end.md").is_file()
    from lightning_modules.config import ATTENTION_BACKENDS
    assert {row["kernel"] for row in shapes["rows"]} == set(ATTENTION_BACKENDS)
    assert startup["data"]["next"]["data"]["prepared"] == {"bpe": "cache", "encoded_from_cache": ["train", "valid"]}
    assert {variant for variant, r in profile["data"]["tiny"]["results"].items() if "profile" in r} == {"eager", "compiled"}
    assert [row["variant"] for row in rest["rows"] if row.get("tokens/s")][::2] == [
        "eager, fused QKV", "compiled, buckets 8, CUDA graphs"]
    assert "## Where the step's time goes" in (tmp_path / "profile.md").read_text()
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) <= 8


@pytest.mark.slow  # two `ablate train` processes at tiny sizes (~40 s on 2 cores)
def test_startup_benchmark_splits_a_first_and_a_next_runs_start_up(tmp_path: Path):
    """`--only startup --quick`: two runs on one cache; each start-up's parts are rows that add up
    to it, the first trains its BPE and encodes, the next takes both from the cache."""
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "startup", "--out", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    section = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["startup"]
    for run, prepared in (("first", {"bpe": "trained", "encoded_from_cache": []}),
                          ("next", {"bpe": "cache", "encoded_from_cache": ["train", "valid"]})):
        data = section["data"][run]
        assert data["data"]["prepared"] == prepared
        rows = [r for r in section["rows"] if r["run"] == run]
        assert [r["part"] for r in rows] == ["imports", "checks", "data", "model", "trainer", "fit", "start-up"]
        assert abs(sum(r["s"] for r in rows[:-1]) - rows[-1]["s"]) < 0.05
    stages = {run: {s["stage"]: s for s in section["data"][run]["data"]["stages"]} for run in ("first", "next")}
    assert stages["next"]["bpe"]["cpu_s"] < stages["first"]["bpe"]["cpu_s"]
    assert section["targets"][0]["goal"] == "≤ 15 s" and section["targets"][0]["met"] is None  # --quick: no verdict
    assert re.search(r"\| start-up of a table's next run \(s\) \| [\d.]+ s \| ≤ 15 s \|", (tmp_path / "results.md").read_text())
    packages = section["data"]["imports_by_package"]
    assert {"torch", "lightning", "lightning_modules", "ablate"} <= set(packages)
    split = [r for r in section["rows"] if r["run"] == "imports by package"]
    assert split[-1]["part"] == "all" and abs(sum(r["s"] for r in split[:-1]) - split[-1]["s"]) < 1e-6


def test_import_times_add_each_modules_own_time_to_its_top_level_package():
    """On a real `python -X importtime`: the per-package sums add up to the whole import time (the
    cumulative times of the outermost imports, within the timer's own overhead), and a package
    imported by another is its own row."""
    from benchmarks.startup import import_times

    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import json; import email.message"],
                          capture_output=True, text=True, check=True)
    lines = done.stderr.splitlines()
    packages = import_times(lines)
    outermost = [int(m.group(1)) for m in (re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)\s*$", line)
                                           for line in lines) if m]
    assert {"json", "email"} <= set(packages) and list(packages.values()) == sorted(packages.values(), reverse=True)
    assert sum(packages.values()) == pytest.approx(sum(outermost) / 1e6, rel=0.02)  # the timer's own overhead


def test_newstest_files_repeat_both_years_as_training_text_and_keep_2013_as_dev(tmp_path: Path):
    from benchmarks.end_to_end import NEWSTEST_REPEAT, newstest_files

    source = tmp_path / "newstest"
    source.mkdir()
    for year, n in ((2013, 3), (2014, 2)):
        for lang in ("en", "de"):
            (source / f"newstest{year}.{lang}").write_text(
                "".join(f"{lang} {year} sentence {i}\n" for i in range(n)), encoding="utf-8")
    files = newstest_files(source, tmp_path / "work")
    train_en = Path(files["train_src"]).read_text(encoding="utf-8").splitlines()
    train_de = Path(files["train_tgt"]).read_text(encoding="utf-8").splitlines()
    assert len(train_en) == len(train_de) == 5 * NEWSTEST_REPEAT
    assert train_en[:5] == ["en 2013 sentence 0", "en 2013 sentence 1", "en 2013 sentence 2",
                            "en 2014 sentence 0", "en 2014 sentence 1"]
    assert [line.replace("de", "en", 1) for line in train_de] == train_en  # still aligned
    assert files["valid_src"] == str(source / "newstest2013.en")
    assert files["valid_tgt"] == str(source / "newstest2013.de")
