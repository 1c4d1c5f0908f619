"""Bad input, one case per test: each must end in exactly one `ablate: error: ...` line naming the
problem, exit status 2, no traceback, and nothing written (no run directory, no database, no
report). The commands run in-process (`ablate.cli.main`) in an empty working directory; a few
run as real processes to check for tracebacks on stderr.

After the cases: input that needs more than one line to set up or to check (damaged archives, a
disk that fills up mid-run, databases that are not Optuna's and must stay byte for byte, the
dashboard's port and password, a report without a base run) and the command line's help.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import tarfile
import sys
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import optuna
import pytest

from ablate.cli import build_parser, main
from here import ablate_here
from test_slurm import wait_until_stopped
from lightning_modules.config import DataConfig

FAST = ["--no-wandb", "--max-steps", "2", "data.valid_size=50", "data.test_size=50", "train.progress_bar=false"]
SPACE_OK = "params:\n  dropout: {type: float, low: 0.0, high: 0.3}\n"


def files(tmp: Path, **contents: str | bytes) -> dict[str, str]:
    """Write files into `tmp`; returns {name: path}."""
    out = {}
    for name, content in contents.items():
        path = tmp / name.replace("_", ".")
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        out[name] = str(path)
    return out


def corpus(tmp: Path, tgt: str | bytes = "x y\nz w\n", src: str = "a b\nc d\n", valid_src: str = "a b\n") -> list[str]:
    f = files(tmp, train_en=src, train_de=tgt, valid_en=valid_src, valid_de="x y\n")
    return ["--train-src", f["train_en"], "--train-tgt", f["train_de"],
            "--valid-src", f["valid_en"], "--valid-tgt", f["valid_de"]]


LETTERS = ["data.vocab_size=20"]  # a BPE vocabulary the two-line corpus allows
LONG = "a b c d e f g h i j k l m n o p q r s t\n"  # 20 words: 20 or more wordpieces


def damaged_gzip(data: bytes, damage: str) -> bytes:
    """`data` gzipped, then damaged: bad deflate data (zlib.error), cut short (EOFError), or a
    wrong CRC (gzip.BadGzipFile)."""
    packed = gzip.compress(data, mtime=0)
    if damage == "deflate":
        return packed[:10] + bytes([packed[10] ^ 0xFF]) + packed[11:]
    if damage == "truncated":
        return packed[:len(packed) // 2]
    return packed[:-8] + bytes(4) + packed[-4:]


GZIP_DAMAGE = ("deflate", "truncated", "crc")
TEXT = "".join(f"line {i} of a corpus\n" for i in range(300)).encode()


def gzip_corpus(tmp: Path, damage: str) -> list[str]:
    f = files(tmp, train_en_gz=damaged_gzip(TEXT, damage), train_de=TEXT, valid_en="a b\n", valid_de="x y\n")
    return ["--train-src", f["train_en_gz"], "--train-tgt", f["train_de"],
            "--valid-src", f["valid_en"], "--valid-tgt", f["valid_de"]]


def sweep(tmp: Path, space: str, *extra: str) -> list[str]:
    path = files(tmp, space_yaml=space)["space_yaml"]
    return ["sweep", "optuna", "--study", "s", "--storage", f"sqlite:///{tmp}/s.db", "--space", path,
            *extra, *FAST]


def spec(tmp: Path, base: str) -> str:
    """An ablation spec whose base row is `base` (YAML flow text; more rows may follow)."""
    return files(tmp, rows_yaml=f"base: {base}\n")["rows_yaml"]


def users_folder(tmp: Path) -> str:
    """A folder of the user's own that holds files named as a run's are."""
    folder = tmp / "mine"
    (folder / "logs").mkdir(parents=True)
    for name, text in {"results.json": '{"bleu": 99}', "logs/metrics.csv": "step,loss\n", "dev.hyp.txt": "x\n"}.items():
        (folder / name).write_text(text)
    return str(folder)


def users_report(tmp: Path) -> str:
    folder = tmp / "my-report"
    folder.mkdir()
    (folder / "report.html").write_text("<p>mine</p>")
    return str(folder)


def fifo(tmp: Path) -> str:
    path = tmp / "corpus.fifo"
    os.mkfifo(path)
    return str(path)


def a_file(tmp: Path) -> Path:
    return Path(files(tmp, a_txt="not a directory")["a_txt"])


def read_only_dir(tmp: Path) -> Path:
    """A directory this process cannot write into: mode 0o555; as root, whom modes do not stop,
    a path under a file instead."""
    if os.geteuid() == 0:
        return a_file(tmp) / "read-only"
    folder = tmp / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


LAUGHS = "".join(f"    {name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
                 for prev, name in zip([None, *"abcdefgh"], "abcdefghi"))  # 9**9 "lol"s once expanded


def billion_laughs_spec(tmp: Path) -> str:
    """A spec whose base row's paper.ppl is nine levels of aliases (hundreds of millions of nodes)."""
    return files(tmp, rows_yaml=f"base:\n  model: {{}}\n  junk:\n{LAUGHS}  paper: {{ppl: *i}}\n")["rows_yaml"]


def billion_laughs_config(tmp: Path) -> str:
    return files(tmp, laughs_yaml=f"train:\n  junk:\n{LAUGHS}  max_steps: *i\n")["laughs_yaml"]


def deep_yaml(tmp: Path, levels: int, name: str = "deep_yaml", prefix: str = "") -> str:
    return files(tmp, **{name: prefix + "[" * levels + "]" * levels + "\n"})[name]


def big_spec(tmp: Path, mib: float) -> str:
    """A spec of `mib` MiB: rows of its own (a 50 MB one held about 700,000 rows)."""
    rows = "".join(f"r{i}: {{model: {{d_ff: {2048 + i % 7}}}}}\n" for i in range(int(mib * 2 ** 20 / 28)))
    return files(tmp, rows_yaml="base: {model: {}}\n" + rows)["rows_yaml"]


# (case id, argument builder given the tmp dir, text the one error line must contain, environment)
Case = tuple[str, Callable[[Path], list[str]], str, dict[str, str]]
CASES: list[Case] = [
    ("malformed-config-yaml", lambda t: ["train", "--config", files(t, bad_yaml="model: {d_model: [1, 2")["bad_yaml"]], "bad.yaml", {}),
    ("config-yaml-not-a-mapping", lambda t: ["train", "--config", files(t, list_yaml="- 1\n- 2\n")["list_yaml"]], "list.yaml", {}),
    ("config-file-missing", lambda t: ["train", "--config", str(t / "nope.yaml")], "nope.yaml", {}),
    ("config-yaml-of-a-newer-schema", lambda t: ["train", "--config", files(t, new_yaml="schema: 99\nrow: base\n")["new_yaml"]],
     "is of schema version 99, newer than", {}),
    ("malformed-spec-yaml", lambda t: ["table3", "--spec", files(t, rows_yaml="base: {model: [")["rows_yaml"]], "rows.yaml", {}),
    ("spec-without-base", lambda t: ["table3", "--spec", files(t, rows_yaml="A1: {model: {n_heads: 1}}\n")["rows_yaml"]], "'base' row", {}),
    ("spec-file-missing", lambda t: ["params", "--spec", str(t / "nope.yaml")], "nope.yaml", {}),
    ("unknown-key-suggests", lambda t: ["train", "d_modle=64"], "did you mean 'model.d_model'", {}),
    ("unknown-command", lambda t: ["frobnicate"], "frobnicate", {}),  # argparse's own error
    ("unknown-dotted-key", lambda t: ["train", "train.warmup=100"], "did you mean", {}),
    ("override-without-value", lambda t: ["train", "d_model"], "not of the form key=value", {}),
    ("wrong-type-int", lambda t: ["train", "d_model=abc"], "d_model", {}),
    ("wrong-type-bool", lambda t: ["train", "data.ding_dictionary=maybe"], "ding_dictionary", {}),
    ("zero-d-model", lambda t: ["train", "d_model=0"], "must be positive", {}),
    ("negative-heads", lambda t: ["train", "n_heads=-2"], "n_heads", {}),
    ("dropout-one", lambda t: ["train", "dropout=1.0"], "dropout", {}),
    ("dropout-negative", lambda t: ["train", "dropout=-0.1"], "dropout", {}),
    ("label-smoothing-one", lambda t: ["train", "label_smoothing=1"], "label_smoothing", {}),
    ("unknown-positional", lambda t: ["train", "positional=rotary"], "positional", {}),
    ("heads-do-not-divide-d-model", lambda t: ["train", "d_model=100", "n_heads=8"], "n_heads", {}),
    ("max-steps-zero", lambda t: ["train", "--max-steps", "0"], "--max-steps: must be at least 1", {}),
    ("max-steps-zero-as-a-key", lambda t: ["train", "train.max_steps=0"], "max_steps", {}),
    ("memory-limit", lambda t: ["train", "--out", str(t / "run"), "n_heads=64", "d_k=512", "d_v=512",
                                "train.max_memory_gb=2", *FAST], "exceeds train.max_memory_gb=2", {}),
    ("disk-too-small", lambda t: ["train", "--out", str(t / "run"), "d_model=65536", "d_ff=262144",
                                  "n_heads=1", "train.max_memory_gb=100000", *FAST],
     "GB free, but this model's checkpoints need", {}),
    ("model-beyond-the-machine", lambda t: ["train", "--out", str(t / "run"), "n_layers=10000", *FAST],
     "exceeds this machine's memory", {}),
    ("max-len-beyond-the-machine", lambda t: ["train", "--out", str(t / "run"), "model.max_len=100000000000", *FAST],
     "exceeds this machine's memory", {}),
    ("beam-times-length-beyond-the-machine", lambda t: ["train", "--out", str(t / "run"), "eval.beam_size=1024",
                                                        "eval.max_len_offset=100000", "model.max_len=100000", *FAST],
     "the final beam search would need", {}),
    ("max-tokens-below-one-pair", lambda t: ["train", "--out", str(t / "run"), "data.max_tokens=10", *FAST],
     "data.max_tokens=10 is smaller than the longest training pair", {}),
    ("unknown-row", lambda t: ["train", "--row", "Z9"], "unknown row 'Z9'", {}),
    ("unknown-row-in-table3", lambda t: ["table3", "--rows", "base,C33", *FAST], "did you mean 'C3'", {}),
    ("bad-seeds", lambda t: ["table3", "--seeds", "1,x", *FAST], "--seeds", {}),
    ("unknown-preset", lambda t: ["train", "--preset", "huge"], "unknown preset 'huge'", {}),
    ("bad-devices", lambda t: ["train", "--devices", "two"], "train.devices", {}),
    ("space-inverted-range", lambda t: sweep(t, "params:\n  dropout: {type: float, low: 0.5, high: 0.1}\n"), "empty range", {}),
    ("space-equal-bounds", lambda t: sweep(t, "params:\n  n_layers: {type: int, low: 3, high: 3}\n"), "empty range", {}),
    ("space-empty-choices", lambda t: sweep(t, "params:\n  d_model: {type: categorical, choices: []}\n"), "non-empty list", {}),
    ("space-unknown-key", lambda t: sweep(t, "params:\n  d_mdl: {type: int, low: 1, high: 4}\n"), "d_mdl", {}),
    ("space-log-from-zero", lambda t: sweep(t, "params:\n  dropout: {type: float, low: 0.0, high: 0.3, log: true}\n"), "log range", {}),
    ("zero-trials", lambda t: sweep(t, SPACE_OK, "--n-trials", "0"), "--n-trials", {}),
    ("devices-per-run-zero", lambda t: sweep(t, SPACE_OK, "--devices-per-run", "0"), "--devices-per-run", {}),
    ("workers-and-gpus", lambda t: sweep(t, SPACE_OK, "--workers", "2", "--gpus", "0,1"), "not both", {}),
    ("storage-url-malformed", lambda t: ["sweep", "optuna", "--study", "s", "--storage", "nonsense://x",
                                         "--space", files(t, space_yaml=SPACE_OK)["space_yaml"], *FAST], "is not a storage URL", {}),
    ("storage-unreachable", lambda t: ["sweep", "optuna", "--study", "s", "--storage",
                                       "postgresql+psycopg2://ablate:hunter2@127.0.0.1:9/optuna",
                                       "--space", files(t, space_yaml=SPACE_OK)["space_yaml"], *FAST], "cannot open storage", {}),
    ("corpus-file-missing", lambda t: ["train", "--out", str(t / "run"), "--train-src", str(t / "no.en"),
                                       "--train-tgt", str(t / "no.de"), "--valid-src", str(t / "no.en"),
                                       "--valid-tgt", str(t / "no.de"), *FAST], "no.en", {}),
    ("corpus-file-empty", lambda t: ["train", "--out", str(t / "run"), *corpus(t, tgt=""), *FAST], "train.de", {}),
    ("corpus-not-utf8", lambda t: ["train", "--out", str(t / "run"), *corpus(t, tgt=b"x y\n\xff\xfe z\n"), *FAST], "line 2", {}),
    ("corpus-line-counts-differ", lambda t: ["train", "--out", str(t / "run"), *corpus(t, tgt="x y\n"), *FAST], "train.de", {}),
    ("corpus-empty-line-one-side", lambda t: ["train", "--out", str(t / "run"), *corpus(t, tgt="x y\n\n"), *FAST], "line 2", {}),
    ("files-without-target", lambda t: ["train", "--out", str(t / "run"), "--train-src",
                                        files(t, a_en="a\n")["a_en"], *FAST], "train_tgt", {}),
    ("vocab-larger-than-corpus", lambda t: ["train", "--out", str(t / "run"), *corpus(t), "data.vocab_size=5000",
                                            *FAST], "data.vocab_size=5000 is too large", {}),
    ("wandb-online-malformed-key", lambda t: ["train", "--out", str(t / "run"), "--wandb", "online"],
     "API key is malformed", {"WANDB_API_KEY": "not-a-key"}),
    ("wandb-online-without-key", lambda t: ["train", "--out", str(t / "run"), "--wandb", "online"],
     "no API key", {"WANDB_API_KEY": ""}),
    ("output-is-a-file", lambda t: ["train", "--out", files(t, taken_txt="x")["taken_txt"], *FAST],
     "cannot write to output directory", {}),
    ("report-without-table3-study", lambda t: ["report", "--storage", f"sqlite:///{t}/none.db", "--out", str(t / "r")],
     "no database", {}),
    ("report-journal-missing", lambda t: ["report", "--storage", "journal:///none.journal", "--out", str(t / "r")],
     "no database", {}),
    ("storage-proxy-unreachable", lambda t: ["sweep", "optuna", "--study", "s", "--storage", "grpc://127.0.0.1:9",
                                             "--space", files(t, space_yaml=SPACE_OK)["space_yaml"], *FAST],
     "cannot reach the storage proxy at 127.0.0.1:9", {}),
    ("storage-proxy-url-malformed", lambda t: ["sweep", "optuna", "--study", "s", "--storage", "grpc://h:port",
                                               "--space", files(t, space_yaml=SPACE_OK)["space_yaml"], *FAST],
     "grpc://HOST:PORT", {}),
    ("storage-proxy-mistyped-sqlite-path", lambda t: ["storage-proxy", "--storage", f"sqlite:///{t}/tpyo.db"],
     "no database", {}),
    ("storage-proxy-of-a-journal", lambda t: ["storage-proxy", "--storage", "journal:///s.journal"], "serves an RDB", {}),
    ("report-negative-bootstrap", lambda t: ["report", "--out", str(t / "r"), "--bootstrap", "-1"], "--bootstrap", {}),
    ("params-bad-vocab", lambda t: ["params", "--vocab-size", "0"], "vocab", {}),
    # Settings that only Lightning or a worker used to check, after the data was loaded or the table queued
    ("devices-minus-one", lambda t: ["train", "--devices", "-1", *FAST], "train.devices must be auto", {}),
    ("devices-zero", lambda t: ["train", "--devices", "0", *FAST], "train.devices must be auto", {}),
    ("device-ids-on-cpu", lambda t: ["train", "--devices", "0,1", "--accelerator", "cpu", *FAST],
     "lists GPU ids, but this run trains on the CPU", {}),
    ("accelerator-gpu-without-gpu", lambda t: ["train", "--accelerator", "gpu", *FAST], "no CUDA GPU", {}),
    ("accelerator-unknown", lambda t: ["train", "--accelerator", "quantum", *FAST], "train.accelerator", {}),
    ("precision-fp8", lambda t: ["train", "--precision", "fp8", *FAST], "train.precision must be one of", {}),
    ("strategy-unknown", lambda t: ["train", "train.strategy=warp", *FAST], "train.strategy", {}),
    ("compile-mode-unknown", lambda t: ["train", "train.compile_mode=fast", *FAST], "train.compile_mode must be one of", {}),
    ("cuda-graphs-without-buckets", lambda t: ["train", "train.compile_mode=reduce-overhead", *FAST],
     "it needs static shapes, data.shape_buckets > 0", {}),
    ("compile-mode-without-compile", lambda t: ["train", "train.compile_mode=max-autotune-no-cudagraphs", *FAST],
     "add train.compile=true", {}),
    ("attention-backend-unknown", lambda t: ["train", "model.attention_backend=magic", *FAST],
     "model.attention_backend must be one of", {}),
    ("loss-chunks-negative", lambda t: ["train", "train.loss_chunks=-1", *FAST], "train.loss_chunks must be 0", {}),
    ("shape-buckets-negative", lambda t: ["train", "data.shape_buckets=-1", *FAST], "data.shape_buckets must be >= 0", {}),
    ("seed-negative", lambda t: ["train", "--seed", "-1", *FAST], "--seed: must be at least 0", {}),
    ("seed-negative-as-a-key", lambda t: ["train", "train.seed=-1", *FAST], "train.seed must be between 0", {}),
    ("seed-too-large", lambda t: ["train", "--seed", str(2 ** 32), *FAST], "--seed: must be at most 4,294,967,295", {}),
    # Bounds at the door (#72): every count against a stated range, or this machine's cores
    ("workers-a-billion", lambda t: ["table3", "--workers", "1000000000", "--dry-run"], "--workers: must be at most 1,024", {}),
    ("machines-a-billion", lambda t: ["table3", "--machines", "1000000000", "--dry-run"], "--machines: must be at most 10,000", {}),
    ("workers-beyond-the-cores", lambda t: ["table3", "--workers", str(4 * (os.cpu_count() or 1) + 9), *FAST],
     "training processes on this machine's", {}),
    ("cpu-devices-beyond-the-cores", lambda t: ["train", "--out", str(t / "run"), "--devices", "99", "--accelerator",
                                                "cpu", *FAST], "train.devices=99 asks for more than the", {}),
    ("threads-a-hundred-thousand", lambda t: ["train", "train.threads=100000", *FAST], "train.threads must be at most 4,096", {}),
    ("threads-beyond-the-cores", lambda t: ["train", "--out", str(t / "run"), "train.threads=4096", *FAST],
     "train.threads=4096 asks for more than the", {}),
    ("loader-workers-a-thousand", lambda t: ["train", "data.num_workers=1000", *FAST], "data.num_workers must be at most 256", {}),
    ("accumulation-a-billion", lambda t: ["train", "train.accumulate_grad_batches=1000000000", *FAST],
     "train.accumulate_grad_batches must be at most 4,096", {}),
    ("beam-beyond-its-range", lambda t: ["train", "eval.beam_size=5000", *FAST], "eval.beam_size must be at most 1,024", {}),
    ("translate-beam-beyond-its-range", lambda t: ["translate", "runs/x", "--beam", "5000"], "--beam: must be at most 1,024", {}),
    ("bootstrap-beyond-its-range", lambda t: ["report", "--out", str(t / "r"), "--bootstrap", "10000000"],
     "--bootstrap: must be at most 100,000", {}),
    ("warmup-of-401-digits", lambda t: ["train", f"train.warmup_steps={10 ** 400}", *FAST], "train.warmup_steps must be at most", {}),
    ("spec-warmup-of-401-digits", lambda t: ["table3", "--dry-run", "--spec",
                                             spec(t, f"{{model: {{}}, train: {{warmup_steps: {10 ** 400}}}}}")],
     "train.warmup_steps must be a finite number of at most", {}),
    ("spec-scale-nan", lambda t: ["table3", "--dry-run", "scale.steps=.nan"], "scale.steps must be a finite number", {}),
    ("gpus-empty", lambda t: ["table3", "--gpus", "", "--dry-run"], "--gpus takes distinct GPU ids", {}),
    ("gpus-superscript-digit", lambda t: ["table3", "--gpus", "\u00b2", "--dry-run"], "--gpus takes distinct GPU ids", {}),
    ("gpus-the-same-twice", lambda t: ["table3", "--gpus", "0,00", "--dry-run"], "--gpus takes distinct GPU ids", {}),
    ("storage-env-garbage", lambda t: ["table3", "--dry-run"], "is not a storage URL", {"ABLATE_STORAGE": "garbage"}),
    ("journal-a-device", lambda t: ["report", "--storage", "journal:////dev/zero", "--out", str(t / "r")],
     "/dev/zero is not a regular file", {}),
    ("journal-a-fifo", lambda t: ["report", "--storage", f"journal:///{fifo(t)}", "--out", str(t / "r")],
     "corpus.fifo is not a regular file", {}),
    ("journal-a-folder", lambda t: ["table3", "--dry-run", "--storage", f"journal:///{t}"], "is not a regular file", {}),
    ("table3-seed-negative", lambda t: ["table3", "--rows", "base", "--seeds", "1,-1", *FAST], "train.seed", {}),
    ("bleu-tokenizer-unknown", lambda t: ["train", "eval.bleu_tokenize=klingon", *FAST], "eval.bleu_tokenize", {}),
    ("sweep-heartbeat-negative", lambda t: sweep(t, SPACE_OK, "--heartbeat", "-5"), "--heartbeat", {}),
    ("table3-heartbeat-zero", lambda t: ["table3", "--heartbeat", "0", *FAST], "--heartbeat", {}),
    ("prune-startup-trials-negative", lambda t: sweep(t, SPACE_OK, "--prune-startup-trials", "-1"),
     "--prune-startup-trials", {}),
    ("prune-warmup-steps-negative", lambda t: sweep(t, SPACE_OK, "--prune-warmup-steps", "-3"),
     "--prune-warmup-steps", {}),
    ("sweep-workers-negative", lambda t: sweep(t, SPACE_OK, "--workers", "-2"), "--workers", {}),
    ("table3-workers-zero", lambda t: ["table3", "--workers", "0", *FAST], "--workers", {}),
    ("table3-in-memory-storage", lambda t: ["table3", "--rows", "base", "--storage", "sqlite://", *FAST],
     "in-memory SQLite", {}),
    ("sweep-in-memory-storage", lambda t: [*sweep(t, SPACE_OK), "--storage", "sqlite:///:memory:"],
     "in-memory SQLite", {}),
    ("table3-gpu-id-negative", lambda t: ["table3", "--gpus", "-1", *FAST], "distinct GPU ids", {}),
    ("table3-gpu-ids-without-gpu", lambda t: ["table3", "--gpus", "0", *FAST], "no CUDA GPU", {}),
    ("sweep-accelerator-gpu-without-gpu", lambda t: sweep(t, SPACE_OK, "--accelerator", "gpu"), "no CUDA GPU", {}),
    ("table3-strategy-unknown", lambda t: ["table3", "--rows", "base", "train.strategy=warp", *FAST],
     "train.strategy", {}),
    # Spec and search-space values of the wrong type (they failed inside a worker, or after the whole table)
    ("spec-model-value-wrong-type", lambda t: ["table3", "--spec", spec(t, "{model: {d_model: wide}}"), *FAST],
     "row 'base': model.d_model: Value 'wide'", {}),
    ("spec-train-steps-not-a-number", lambda t: ["table3", "--spec", spec(t, "{model: {}, train_steps: lots}"),
                                                 *FAST], "train_steps must be a whole number", {}),
    ("spec-paper-not-a-mapping", lambda t: ["table3", "--spec", spec(t, "{model: {}, paper: 65}"), *FAST],
     "paper must be a mapping", {}),
    ("spec-paper-value-text", lambda t: ["params", "--spec", spec(t, "{model: {}, paper: {ppl: low}}")],
     "paper.ppl must be a number", {}),
    ("spec-row-n-kv-heads-3", lambda t: ["params", "--spec", spec(t, "{model: {}}\nX: {model: {n_kv_heads: 3}}")],
     "row 'X': model.n_kv_heads=3 does not divide", {}),
    ("spec-row-rope-odd-d-k", lambda t: ["params", "--spec", spec(t, "{model: {}}\nY: {model: {positional: rope, d_k: 63}}")],
     "row 'Y': model.positional=rope", {}),
    ("train-spec-row-n-kv-heads-3", lambda t: ["train", "--row", "X", "--spec",
                                               spec(t, "{model: {}}\nX: {model: {n_kv_heads: 3}}"), *FAST],
     "row 'X' (preset tiny", {}),
    # Input limits (foundation/yaml_input.py: one loader for every YAML file): no alias,
    # no key twice, at most 64 levels, 1 MiB, 1,000 rows
    ("spec-yaml-alias", lambda t: ["params", "--spec", files(t, rows_yaml="base: &b {model: {}}\nX: *b\n")["rows_yaml"]],
     "aliases (*name) are not accepted", {}),
    ("config-yaml-alias", lambda t: ["train", "--config", files(t, c_yaml="model: {d_model: &w 64, d_ff: *w}\n")["c_yaml"],
                                     *FAST], "c.yaml: malformed YAML at line 1, column 31: aliases", {}),
    ("spec-nested-too-deep", lambda t: ["params", "--spec", deep_yaml(t, 100, "rows_yaml", "base: {model: {}}\nX: ")],
     "nested deeper than 64 levels", {}),
    ("config-nested-too-deep", lambda t: ["train", "--config", deep_yaml(t, 100, "c_yaml", "model: "), *FAST],
     "nested deeper than 64 levels", {}),
    ("spec-larger-than-1-mib", lambda t: ["params", "--spec", big_spec(t, 1.1)], "larger than 1024 KiB", {}),
    ("spec-over-1000-rows", lambda t: ["params", "--spec", big_spec(t, 0.03)], "more than the 1,000 a spec may have", {}),
    ("config-key-twice", lambda t: ["train", "--config", files(t, c_yaml="model: {dropout: 0.1, dropout: 0.3}\n")["c_yaml"],
                                    *FAST], "'dropout' is given twice", {}),
    ("space-key-twice", lambda t: ["sweep", "wandb", "--out", str(t / "sweep.yaml"), "--space",
                                   files(t, space_yaml=SPACE_OK + "  dropout: {type: float, low: 0.1, high: 0.2}\n")["space_yaml"]],
     "'dropout' is given twice", {}),
    ("spec-unknown-row-key", lambda t: ["train", "--spec", spec(t, "{model: {}, train_step: 10}")],
     "unknown keys: train_step", {}),
    ("spec-row-dropout-text", lambda t: ["train", "--row", "X", "--spec",
                                         spec(t, "{model: {}}\nX: {model: {dropout: none}}")],
     "row 'X': model.dropout", {}),
    ("space-categorical-wrong-type", lambda t: sweep(t, "params:\n  d_model: {type: categorical, choices: [wide, narrow]}\n"),
     "params.d_model: model.d_model: Value 'wide'", {}),
    ("space-float-range-for-int-key", lambda t: sweep(t, "params:\n  d_model: {type: float, low: 32, high: 64}\n"),
     "params.d_model: model.d_model: Value '32.0'", {}),
    ("space-bool-choice", lambda t: sweep(t, "params:\n  data.ding_dictionary: {type: categorical, choices: [true, maybe]}\n"),
     "not a valid bool", {}),
    ("space-grid-value-for-int-key", lambda t: sweep(t, "params:\n  n_layers: {type: int, low: 1, high: 3, grid: [1, 1.5]}\n"),
     "Value '1.5'", {}),
    ("space-fixed-wrong-type", lambda t: sweep(t, SPACE_OK + "fixed: {n_heads: many}\n"), "fixed.n_heads", {}),
    ("wandb-space-wrong-type", lambda t: ["sweep", "wandb", "--out", str(t / "sweep.yaml"), "--space",
                                         files(t, space_yaml="params:\n  d_ff: {type: categorical, choices: [big]}\n")["space_yaml"]],
     "model.d_ff", {}),
    # Output paths that were found unwritable only when written (the report: after the whole table)
    ("report-out-under-a-file", lambda t: ["report", "--out", str(a_file(t) / "rep")],
     "cannot write the report to", {}),
    ("report-out-is-a-file", lambda t: ["report", "--out", str(a_file(t))], "is not a directory", {}),
    ("table3-report-dir-a-file", lambda t: ["table3", "--rows", "base", "--report-dir", str(a_file(t)), *FAST],
     "cannot write the report (--report-dir)", {}),
    ("table3-runs-dir-read-only", lambda t: ["table3", "--rows", "base", "--runs-dir", str(read_only_dir(t)), *FAST],
     "cannot write the run directories (--runs-dir)", {}),
    ("sweep-runs-dir-read-only", lambda t: sweep(t, SPACE_OK, "--runs-dir", str(read_only_dir(t) / "runs")),
     "cannot write the trials' run directories", {}),
    ("train-out-read-only", lambda t: ["train", "--out", str(read_only_dir(t) / "run"), *FAST],
     "cannot write to output directory", {}),
    ("wandb-out-a-directory", lambda t: ["sweep", "wandb", "--space", files(t, space_yaml=SPACE_OK)["space_yaml"],
                                         "--out", str(t)], "is a directory", {}),
    ("wandb-out-missing-parent", lambda t: ["sweep", "wandb", "--space", files(t, space_yaml=SPACE_OK)["space_yaml"],
                                            "--out", str(t / "nope" / "sweep.yaml")], "does not exist", {}),
    ("storage-under-a-file", lambda t: ["table3", "--rows", "base", "--storage", f"sqlite:///{a_file(t)}/s.db", *FAST],
     "cannot write the database s.db", {}),
    # Runs that would do nothing but report success, or train something other than they say
    ("max-train-len-one", lambda t: ["train", "--out", str(t / "run"), *corpus(t), *LETTERS, "data.max_train_len=1",
                                     *FAST], "no training pairs left: all 2 are longer than 1 wordpieces", {}),
    ("corpus-every-line-too-long", lambda t: ["train", "--out", str(t / "run"), *corpus(t, src=LONG + LONG),
                                              "data.vocab_size=40", "data.max_train_len=6", *FAST],
     "no training pairs left: all 2 are longer than 6 wordpieces on a side; raise data.max_train_len", {}),
    # ... and the same data found in the parent of a table or sweep, before anything is queued
    ("table3-max-train-len-one", lambda t: ["table3", "--rows", "base", *corpus(t), *LETTERS, "data.max_train_len=1",
                                            *FAST], "no training pairs left: all 2 are longer than 1 wordpieces", {}),
    ("sweep-every-line-too-long", lambda t: sweep(t, SPACE_OK, *corpus(t, src=LONG + LONG), "data.vocab_size=40",
                                                  "data.max_train_len=6"),
     "no training pairs left: all 2 are longer than 6 wordpieces on a side", {}),
    ("table3-gzip-corpus-deflate", lambda t: ["table3", "--rows", "base", *gzip_corpus(t, "deflate"), *FAST],
     "train.en.gz: damaged gzip file", {}),
    ("dev-lines-too-long", lambda t: ["train", "--out", str(t / "run"), *corpus(t, valid_src=LONG), *LETTERS,
                                      "model.max_len=16", *FAST], "no dev pairs left: all 1", {}),
    ("max-len-tiny", lambda t: ["train", "model.max_len=2", *FAST], "model.max_len=2 is too short", {}),
    ("row-as-override", lambda t: ["train", "row=Z9", *FAST], "choose the row with --row", {}),
    ("preset-as-override", lambda t: ["table3", "preset=paper", *FAST], "choose the preset with --preset", {}),
    ("space-samples-the-row", lambda t: sweep(t, "params:\n  row: {type: categorical, choices: [base, A1]}\n"),
     "choose the row with --row", {}),
    # Names that become paths (one rule, foundation/names.py): checked before anything is written
    ("spec-row-walks-out", lambda t: ["table3", "--spec", spec(t, "{model: {}}\n'../../../../x': {model: {}}"), *FAST],
     "bad row name '../../../../x'", {}),
    ("spec-row-absolute", lambda t: ["table3", "--spec", spec(t, f"{{model: {{}}}}\n'{t}/x': {{model: {{}}}}"), *FAST],
     "bad row name", {}),
    ("spec-row-300-characters", lambda t: ["table3", "--spec", spec(t, "{model: {}}\n" + "r" * 300 + ": {model: {}}"),
                                           *FAST], "is 300 characters long", {}),
    ("spec-row-nul-byte", lambda t: ["table3", "--spec", spec(t, '{model: {}}\n"a\\0b": {model: {}}'), *FAST],
     "bad row name", {}),
    ("spec-group-walks-out", lambda t: ["table3", "--spec", spec(t, "{model: {}}\nX: {group: ../../g, model: {}}"),
                                        *FAST], "bad group name '../../g'", {}),
    ("spec-group-in-params", lambda t: ["params", "--spec", spec(t, "{model: {}}\nX: {group: 'a/b', model: {}}")],
     "bad group name 'a/b'", {}),
    ("table3-study-walks-out", lambda t: ["table3", "--study", "../../x", *FAST], "argument --study", {}),
    ("table3-study-absolute", lambda t: ["table3", "--study", str(t / "x"), *FAST], "argument --study", {}),
    ("sweep-study-walks-out", lambda t: [*sweep(t, SPACE_OK), "--study", "../x"], "argument --study", {}),
    ("sweep-study-too-long", lambda t: [*sweep(t, SPACE_OK), "--study", "s" * 300], "at most 64", {}),
    # Messages from below: ours, one line, naming the file and the cause
    ("corpus-cr-only-line-ends", lambda t: ["train", "--out", str(t / "run"),
                                            *corpus(t, src="a b\rc d\r", tgt="x y\rz w\r"), *FAST],
     "line 1 holds a carriage return", {}),
    ("corpus-is-a-directory", lambda t: ["train", "--out", str(t / "run"), *corpus(t)[:2], "--train-tgt", str(t),
                                         *corpus(t)[4:], *FAST], "is a directory, not a file", {}),
    ("corpus-is-dev-null", lambda t: ["train", "--out", str(t / "run"), "--train-src", "/dev/null", *corpus(t)[2:],
                                      *FAST], "/dev/null: not a regular file", {}),
    ("corpus-is-a-fifo", lambda t: ["train", "--out", str(t / "run"), "--train-src", fifo(t), *corpus(t)[2:], *FAST],
     "not a regular file (a FIFO", {}),
    ("spec-is-a-directory", lambda t: ["table3", "--spec", str(t), *FAST], "is a directory", {}),
    # A folder that is not a run of ours: refused before anything in it is touched
    ("train-out-a-users-own-folder", lambda t: ["train", "--out", users_folder(t), *FAST],
     "is not an ablate run directory (it holds dev.hyp.txt, logs, results.json", {}),
    ("report-out-a-users-own-folder", lambda t: ["report", "--storage", f"sqlite:///{t}/none.db", "--out",
                                                 users_report(t)], "is not an ablate report directory", {}),
    ("table3-report-dir-a-users-own-folder", lambda t: ["table3", "--rows", "base", "--report-dir", users_report(t),
                                                        *FAST], "is not an ablate report directory", {}),
    # Damaged or odd input that crashed
    *[(f"gzip-corpus-{damage}", lambda t, damage=damage: ["train", "--out", str(t / "run"), *gzip_corpus(t, damage),
                                                           *FAST], "train.en.gz: damaged gzip file", {})
      for damage in GZIP_DAMAGE],
]
# Valid on a machine with a GPU: skipped there.
NEED_NO_GPU = {"accelerator-gpu-without-gpu", "table3-device-ids-without-gpu", "sweep-accelerator-gpu-without-gpu"}


CACHE_DIR = Path(DataConfig().cache_dir)  # the preparation cache's default place: under ~
SHARED_CACHE = CACHE_DIR.expanduser()  # read before a test moves HOME


def gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case: Case, tmp_path: Path, monkeypatch, capsys):
    name, build, expected, env = case
    if name in NEED_NO_GPU and gpu_visible():
        pytest.skip("valid on this machine: it has a GPU")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: no W&B key unless a case sets one
    # ... but the preparation cache the other tests fill (data.cache_dir, under ~): a case that gets as
    # far as the data would otherwise extract the dictionary and train a BPE model each time
    SHARED_CACHE.mkdir(parents=True, exist_ok=True)
    moved = tmp_path / "home" / CACHE_DIR.relative_to("~")
    moved.parent.mkdir(parents=True)
    moved.symlink_to(SHARED_CACHE)
    monkeypatch.setattr("sweeps.storage.GRPC_CONNECT_S", 1.0)  # storage-proxy-unreachable: 1 s, not 10
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = build(tmp_path)
    before = {p for p in tmp_path.rglob("*")}
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's errors exit from inside main()
        code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(err) == 1 and err[0].startswith("ablate: error: "), err
    assert expected in err[0], err[0]
    assert "hunter2" not in err[0]  # a database password is never printed
    created = sorted(str(p.relative_to(tmp_path)) for p in set(tmp_path.rglob("*")) - before)
    assert not [c for c in created if not c.startswith("home")], f"{name} wrote {created}"


def _peak_of(args: list[str], cwd: Path, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """Run `ablate ARGS` as a real process under a 4 GiB address-space guard (the machine's own
    safety, not the limit tested); its peak resident memory in GiB (GNU time's %M)."""
    import resource

    if not os.access("/usr/bin/time", os.X_OK):
        pytest.skip("GNU time (/usr/bin/time, Debian's time package) measures the peak here")

    def guard() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2 ** 30, 4 * 2 ** 30))

    peak = cwd / "peak.txt"
    cmd = ["/usr/bin/time", "-o", str(peak), "-f", "%M", sys.executable, "-m", "ablate", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            preexec_fn=guard, start_new_session=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # time and the command under it
        proc.communicate()
        raise AssertionError(f"no answer within {timeout:g} s") from None
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    kib = int(peak.read_text().strip().splitlines()[-1])
    peak.unlink()
    return result, kib / 2 ** 20


def report_study_with_translations(tmp: Path, sentences: int) -> str:
    """A Table 3 study with base and A1 complete, each with `sentences` dev translations."""
    fake_table3_study(tmp / "t.db", ["base", "A1"], dev_lines=sentences)
    return f"sqlite:///{tmp / 't.db'}"


HOSTILE = [
    ("spec-billion-laughs", lambda t: ["params", "--spec", billion_laughs_spec(t)], "aliases (*name) are not accepted"),
    ("config-billion-laughs", lambda t: ["train", "--config", billion_laughs_config(t), *FAST], "aliases (*name)"),
    ("spec-10000-levels", lambda t: ["params", "--spec", deep_yaml(t, 10000, "rows_yaml", "base: ")], "nested deeper"),
    ("config-10000-levels", lambda t: ["train", "--config", deep_yaml(t, 10000, "c_yaml", "model: "), *FAST],
     "nested deeper"),
    ("spec-50-mib", lambda t: ["params", "--spec", big_spec(t, 50)], "larger than 1024 KiB"),
    ("report-bootstrap-100000000", lambda t: ["report", "--storage", report_study_with_translations(t, 10), "--out",
                                              str(t / "r"), "--bootstrap", "100000000"], "--bootstrap: must be at most 100,000"),
]


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_input_is_one_line_within_2_gb_and_a_minute(case, tmp_path: Path):
    """Small hostile inputs (aliases that expand to billions of nodes, 10,000 levels of nesting,
    a 50 MiB spec, a count asking for a 37 GiB allocation): one line, exit 2, nothing written,
    a peak under 2 GB and an answer within a minute (a real process)."""
    name, build, expected = case
    work = tmp_path / "work"
    work.mkdir()
    args = build(tmp_path)
    before = set(tmp_path.rglob("*"))
    result, peak_gib = _peak_of(args, work, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0].startswith("ablate: error: ") and expected in lines[0], lines[0]
    assert peak_gib < 2, f"{name}: {peak_gib:.2f} GiB"
    assert set(tmp_path.rglob("*")) == before


def test_there_are_at_least_thirty_cases():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("args", [["train", "d_model=abc"], ["train", "--preset", "huge"],
                                  ["train", "--seed", "-1"], ["table3", "--workers", "0"],
                                  ["sweep", "optuna", "--study", "s", "--space", "/nonexistent.yaml"],
                                  ["report", "--storage", "nonsense://", "--out", "r"], ["frobnicate"]])
def test_real_process_prints_no_traceback(args: list[str], tmp_path: Path):
    result = subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("damage", ["deflate", "truncated"])  # (tar stops before gzip checks its CRC)
def test_damaged_corpus_archive_is_one_line_naming_it(damage: str, tmp_path: Path):
    """A downloaded .tgz that is damaged (cached from an interrupted copy, say) is a UserError
    naming it, whichever way gzip fails: WMT14 read as the product reads it, from its cache."""
    from foundation.errors import UserError
    from lightning_modules.config import DataConfig
    from lightning_modules.data.corpora import WMT14_TRAIN_ARCHIVES, load_corpus

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for lang in ("en", "de"):
            info = tarfile.TarInfo(f"{WMT14_TRAIN_ARCHIVES[0][1]}.{lang}")
            info.size = len(TEXT)
            tar.addfile(info, io.BytesIO(TEXT))
    cache = tmp_path / "wmt14"
    cache.mkdir()
    names = [url.rsplit("/", 1)[-1] for url, _ in WMT14_TRAIN_ARCHIVES]
    (cache / names[0]).write_bytes(damaged_gzip(buffer.getvalue(), damage))
    for name in [*names[1:], *(f"newstest201{k}.{lang}" for k in (3, 4) for lang in ("en", "de"))]:
        (cache / name).write_bytes(TEXT)  # cached: nothing is fetched (the mirror is unreachable)
    config = DataConfig(corpus="wmt14", base_url="http://127.0.0.1:9", cache_dir=str(tmp_path))
    with pytest.raises(UserError, match=f"{names[0]}: not a valid archive") as err:
        load_corpus(config)
    assert "\n" not in str(err.value) and not (cache / "train.en").exists()


# Run inside a private mount namespace (`unshare -Urm`): mount a small tmpfs, train into it, stop
# the run at step 2 (step 1's checkpoint written, step 2's not yet), fill the tmpfs, let the run go
# on into a full disk.
DISK_FULL_DRIVER = r"""
import json, os, signal, subprocess, sys, zipfile
from pathlib import Path

mount, args = Path(sys.argv[1]), sys.argv[2:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(mount)], check=True)
env = {**os.environ, "ABLATE_FAULT": "train_step@2:SIGSTOP"}
run = subprocess.Popen([sys.executable, "-m", "ablate", "train", "--out", str(mount / "run"), *args],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
_, status = os.waitpid(run.pid, os.WUNTRACED)
stopped = os.WIFSTOPPED(status)
if stopped:
    try:
        with open(mount / "filler", "wb") as filler:
            while True:
                filler.write(bytes(1 << 20))
                filler.flush()
    except OSError:
        pass
    os.kill(run.pid, signal.SIGCONT)
stderr = run.stderr.read()
code = run.wait() if stopped else os.waitstatus_to_exitcode(status)
out = mount / "run"
checkpoints = {p.name: zipfile.ZipFile(p).testzip() is None for p in (out / "checkpoints").glob("*.ckpt")}
print(json.dumps({"stopped": stopped, "code": code, "stderr": stderr, "checkpoints": checkpoints,
                  "files": sorted(str(p.relative_to(out)) for p in out.rglob("*"))}))
"""


def mount_namespace_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-Urm", "true"], capture_output=True, timeout=30).returncode == 0


def test_disk_full_mid_run_is_one_line_and_leaves_no_half_written_file(tmp_path: Path):
    """A real ENOSPC (a full tmpfs) while training: exit status 1, one `ablate: error:` line and no
    traceback; results.json is not written, no temporary file is left, the checkpoint written before
    the disk filled is whole (the same command resumes from it once there is space)."""
    if not mount_namespace_available():
        pytest.skip("cannot mount a tmpfs here: `unshare -Urm` (an unprivileged mount namespace) is refused")
    mount = tmp_path / "tiny-disk"
    mount.mkdir()
    args = [*corpus(tmp_path), *LETTERS, "--max-steps", "4", "--no-wandb", "train.progress_bar=false",
            "train.checkpoint_every=1", "d_model=16", "d_ff=32", "n_heads=2", "n_layers=1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(["unshare", "-Urm", sys.executable, "-c", DISK_FULL_DRIVER, str(mount), *args],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["stopped"], report["stderr"][-3000:]
    errors = [line for line in report["stderr"].splitlines() if line.startswith("ablate: error:")]
    assert report["code"] == 1 and "Traceback" not in report["stderr"], report["stderr"][-3000:]
    assert len(errors) == 1 and "the disk is full" in errors[0], report["stderr"][-3000:]
    assert report["stderr"].strip().splitlines()[-1] == errors[0]
    assert "results.json" not in report["files"] and not [f for f in report["files"] if f.endswith(".tmp")]
    assert report["checkpoints"] and all(report["checkpoints"].values()), report["files"]


FULL_DISK_DRIVER = r"""
import json, os, subprocess, sys
from pathlib import Path

mount, free_kib, args = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], check=True)
filler = mount / ".filler"
try:
    with open(filler, "wb") as handle:
        while True:
            handle.write(bytes(1 << 16))
            handle.flush()
except OSError:
    pass
os.truncate(filler, max(0, filler.stat().st_size - free_kib * 1024))  # leave free_kib KiB
before = sorted(str(p.relative_to(mount)) for p in mount.rglob("*"))
run = subprocess.run([sys.executable, "-m", "ablate", *[a.replace("MOUNT", str(mount)) for a in args]],
                     capture_output=True, text=True)
print(json.dumps({"code": run.returncode, "stderr": run.stderr, "before": before,
                  "after": sorted(str(p.relative_to(mount)) for p in mount.rglob("*"))}))
"""


def on_a_full_disk(tmp: Path, free_kib: int, *args: str) -> dict:
    """`ablate ARGS` (MOUNT: a 20 MB tmpfs with `free_kib` KiB left), in a private mount namespace."""
    if not mount_namespace_available():
        pytest.skip("cannot mount a tmpfs here: `unshare -Urm` (an unprivileged mount namespace) is refused")
    mount = tmp / "tiny-disk"
    mount.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(["unshare", "-Urm", sys.executable, "-c", FULL_DISK_DRIVER, str(mount), str(free_kib), *args],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", ["train", "report"])
def test_a_full_disk_is_one_line_exit_1_and_leaves_nothing_half_written(command: str, tmp_path: Path):
    """`train` on a disk already full (its checks wrote the marker and the lock outside any
    handler: a traceback), and a report whose disk fills while it writes (it refused in one line
    but left the files written so far): one line, exit status 1, and the disk holds what it held."""
    if command == "train":
        args = ["train", "--out", "MOUNT/run", *corpus(tmp_path), *LETTERS, *FAST]
        report = on_a_full_disk(tmp_path, 0, *args)
    else:
        fake_table3_study(tmp_path / "t.db", ["base", "A1", "B1", "C1"])
        report = on_a_full_disk(tmp_path, 24, "report", "--storage", f"sqlite:///{tmp_path / 't.db'}", "--out", "MOUNT/r")
    lines = report["stderr"].strip().splitlines()
    assert report["code"] == 1 and "Traceback" not in report["stderr"], report["stderr"][-3000:]
    assert len(lines) == 1 and lines[0].startswith("ablate: error: ") and "the disk is full" in lines[0], lines
    assert report["after"] == report["before"], report["after"]


def packed(data: bytes) -> str:
    import base64
    import zlib
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


# (case id, trial attribute, its stored JSON, what the one line says); the trial is base's
DAMAGED_TRIALS = [
    ("bleu-text", "bleu", '"high"', "bleu: input should be a valid number (it holds 'high')"),
    ("ppl-infinite", "ppl", "Infinity", "ppl: input should be a finite number"),
    ("curve-nan", "dev_ppl_curve", "[[5, NaN]]", "dev_ppl_curve[0][1]: input should be a finite number"),
    ("curve-text", "dev_ppl_curve", '"falling"', "dev_ppl_curve: input should be a valid list"),
    ("curve-triples", "dev_ppl_curve", "[[5, 10.0, 3]]", "dev_ppl_curve[0]: list should have at most 2 items"),
    ("environment-text", "environment", '"a laptop"', "environment: input should be a valid dictionary"),
    ("seed-not-a-number", "seed", '"first"', "seed: input should be a valid integer"),
    ("hyp-not-base64", "dev_hyp", '"!!!"', "dev_hyp: the packed sentences are damaged (Error"),
    ("hyp-not-zlib", "dev_hyp", '"aGVsbG8="', "dev_hyp: the packed sentences are damaged (zlib"),
    ("hyp-not-utf8", "dev_hyp", json.dumps(packed(b"\xff\xfe")), "dev_hyp: the packed sentences are damaged (UnicodeDecodeError"),
    ("hyp-a-zlib-bomb", "dev_hyp", json.dumps(packed(bytes(300 * 2 ** 20))), "dev_hyp: the packed sentences inflate to more than 256 MiB"),
    ("hyp-fewer-lines", "dev_hyp", json.dumps(packed(b"sentence 0")), "1 dev translations for 3 references"),
    ("ref-two-million-lines", "dev_ref", json.dumps(packed(b"r\n" * 2_000_000)), "3 dev translations for 2,000,001 references"),
]


@pytest.mark.parametrize("case", DAMAGED_TRIALS, ids=[c[0] for c in DAMAGED_TRIALS])
def test_a_report_on_a_damaged_trial_is_one_line_naming_it(case, tmp_path: Path, capsys):
    """A study whose base trial holds what no run writes (an edited or damaged database): one line
    naming the trial and the field, exit 2, no report written, within the memory of a report (a
    small attribute that inflates to gigabytes is stopped at 256 MiB)."""
    name, key, value, said = case
    db = tmp_path / "t.db"
    fake_table3_study(db, ["base", "A1"], dev_lines=3)
    study = optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{db}")
    base = next(t for t in study.get_trials() if t.user_attrs["row"] == "base")
    with closing(sqlite3.connect(db)) as con, con:  # the edit
        con.execute("DELETE FROM trial_user_attributes WHERE trial_id = ? AND key = ?", (base._trial_id, key))
        con.execute("INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, ?, ?)",
                    (base._trial_id, key, value))
    assert main(["report", "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"study 'table3-tiny': trial {base.number}" in err[0] and said in err[0], err
    assert not (tmp_path / "r").exists()


def test_rows_trained_with_another_vocabulary_are_not_compared_in_ppl(tmp_path: Path, capsys):
    """A1 and B1 trained with a 500-piece vocabulary, base with 4,000: their PPL is per another
    wordpiece, so the report says so first and compares their BLEU alone (it had crashed)."""
    db = tmp_path / "t.db"
    fake_table3_study(db, ["base", "A1", "B1"])
    study = optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{db}")
    with closing(sqlite3.connect(db)) as con, con:
        for trial in study.get_trials():
            size = 4000 if trial.user_attrs["row"] == "base" else 500
            con.execute("INSERT INTO trial_user_attributes (trial_id, key, value_json) VALUES (?, 'model', ?)",
                        (trial._trial_id, json.dumps({"vocab_size": size, "d_model": 64})))
    assert main(["report", "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "table3.md").read_text()
    assert "Not comparable in PPL: A1 (500 against 4,000), B1 (500 against 4,000)" in md
    frame = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:]] for line in md.splitlines()
             if line.startswith("| A1 ") or line.startswith("| B1 ")}
    assert all(cells[3] == "" for cells in frame.values())  # no PPL change against base
    assert all(cells[8] == "-1.00" or cells[8] == "-2.00" for cells in frame.values())  # the BLEU change is there


def test_a_seed_stored_as_text_reads_as_its_number(tmp_path: Path, capsys):
    db = tmp_path / "t.db"
    fake_table3_study(db, ["base", "A1"])
    study = optuna.load_study(study_name="table3-tiny", storage=f"sqlite:///{db}")
    base = next(t for t in study.get_trials() if t.user_attrs["row"] == "base")
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? AND key = 'seed'",
                    ('"1"', base._trial_id))
    assert main(["report", "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "r")]) == 0
    assert "| base " in (tmp_path / "r" / "table3.md").read_text()


@pytest.mark.parametrize("key, value, said", [("spec", '["base"]', "spec: input should be a valid dictionary"),
                                              ("overrides", '"d_model=64"', "overrides: input should be a valid list"),
                                              ("schema", "2", "is of schema version 2, newer than")])
def test_a_report_on_a_damaged_study_record_is_one_line(key, value, said, tmp_path: Path, capsys):
    db = tmp_path / "t.db"
    fake_table3_study(db, ["base", "A1"])
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE study_user_attributes SET value_json = ? WHERE key = ?", (value, key))
    assert main(["report", "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "study 'table3-tiny'" in err[0] and said in err[0], err
    assert not (tmp_path / "r").exists()


def test_a_deleted_working_directory_is_one_line(tmp_path: Path):
    """`ablate train` from a folder deleted after the shell entered it: one `ablate: error:` line
    (it ended in a oneMKL FATAL ERROR line from torch's import), exit status 1."""
    script = f'mkdir gone && cd gone && rmdir ../gone && exec "{sys.executable}" -m ablate train --no-wandb --max-steps 1'
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("ablate: error: the working directory no longer exists"), lines


def test_wandb_online_without_a_network_waits_a_bounded_time_then_logs_offline(tmp_path: Path):
    """`--wandb online` with a well-formed key and no way to reach W&B (a closed port stands for
    the host): W&B's own init_timeout bounds the wait ($WANDB_INIT_TIMEOUT here, 30 s by default;
    it retried for 106 s, then printed a traceback), one warning line of ours, and the run trains
    to the end with an offline W&B run that `wandb sync` can upload later."""
    import time

    env = {**os.environ, "WANDB_API_KEY": "a" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_INIT_TIMEOUT": "2",
           "HOME": str(tmp_path / "home"), "PYTHONWARNINGS": "ignore", "WANDB_SILENT": "true"}
    out = tmp_path / "run"
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "ablate", "train", "--out", str(out), "--wandb", "online",
                             *corpus(tmp_path), *LETTERS, *FAST[1:]], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=env)
    took = time.monotonic() - start
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if "W&B online could not start" in line]
    assert len(warned) == 1 and warned[0].startswith("ablate: warning: ") and "logging offline" in warned[0], warned
    assert list((out / "wandb").glob("offline-run-*")), sorted(p.name for p in (out / "wandb").iterdir())
    assert json.loads((out / "results.json").read_text())["status"] == "complete"
    assert took < 150, took


def measurements_db(tmp: Path) -> Path:
    """An SQLite database of someone else's (not Optuna's)."""
    path = tmp / "measurements.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE measurements (t REAL, value REAL)")
        db.execute("INSERT INTO measurements VALUES (0.5, 42.0)")
        db.commit()
    return path


DATABASE_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "other-sqlite": (measurements_db, "is not an Optuna database (its tables: measurements)"),
    "empty-file": (lambda t: Path(files(t, empty_db=b"")["empty_db"]), "is not an Optuna database (it has no tables)"),
    "text-file": (lambda t: Path(files(t, notes_db="results: fine\n")["notes_db"]), "is not an SQLite database"),
}


@pytest.mark.parametrize("command", ["report", "dashboard", "sweep"])
@pytest.mark.parametrize("kind", list(DATABASE_FILES))
def test_a_database_that_is_not_optunas_is_refused_and_left_byte_for_byte(command: str, kind: str,
                                                                         tmp_path: Path, capsys):
    """report and dashboard only read: they never create a database or add Optuna's tables to
    another; a sweep refuses to add them to a database that is not empty and not Optuna's."""
    if kind == "empty-file" and command == "sweep":
        pytest.skip("an empty file is a new SQLite database: a sweep may create its tables there")
    make, expected = DATABASE_FILES[kind]
    path = make(tmp_path)
    before = path.read_bytes()
    storage = f"sqlite:///{path}"
    with socket.socket() as taken:  # were the storage accepted, the dashboard would fail here, not serve
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = {"report": ["report", "--storage", storage, "--out", str(tmp_path / "r")],
                "dashboard": ["dashboard", "--storage", storage, "--port", str(taken.getsockname()[1])],
                "sweep": [*sweep(tmp_path, SPACE_OK), "--storage", storage, "--runs-dir", str(tmp_path / "runs")]}
        code = main(args[command])
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("ablate: error: ") and err.count("\n") == 1, err
    assert expected in err and not out, err
    assert path.read_bytes() == before
    assert {p.name for p in tmp_path.iterdir()} <= {path.name, "space.yaml"}  # no journal, report, runs


def test_report_reads_an_optuna_database_without_writing_to_it(tmp_path: Path, capsys):
    path = tmp_path / "sweeps.db"
    optuna.create_study(study_name="a-sweep", storage=f"sqlite:///{path}")
    before = path.read_bytes()
    assert main(["report", "--storage", f"sqlite:///{path}", "--out", str(tmp_path / "r")]) == 2
    assert "holds 0 Table 3 studies" in capsys.readouterr().err
    assert path.read_bytes() == before and sorted(tmp_path.iterdir()) == [path]


def a_sweep_database(tmp_path: Path) -> Path:
    path = tmp_path / "sweeps.db"
    optuna.create_study(study_name="a-sweep", storage=f"sqlite:///{path}")
    return path


@contextmanager
def a_taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another socket listens on while inside."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_dashboard_on_a_busy_port_says_so_before_printing_anything(tmp_path: Path, capsys):
    path = a_sweep_database(tmp_path)
    with a_taken_port() as port:
        code = main(["dashboard", "--storage", f"sqlite:///{path}", "--port", str(port)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out  # no "optuna-dashboard for ..." nor "Listening on" first
    assert err == f"ablate: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_storage_proxy_on_a_busy_port_is_our_one_line_and_nothing_else(tmp_path: Path):
    """A real process: gRPC's C core logged its own line before ours, and the banner came first."""
    pytest.importorskip("grpc", reason="grpcio is not installed")
    path = a_sweep_database(tmp_path)
    with a_taken_port() as port:
        result = subprocess.run([sys.executable, "-m", "ablate", "storage-proxy", "--storage", f"sqlite:///{path}",
                                 "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert result.stderr == f"ablate: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


@pytest.mark.parametrize("command", ["dashboard", "storage-proxy"])
def test_listening_beyond_this_machine_is_said_in_one_line(command: str, tmp_path: Path):
    """`--host 0.0.0.0` serves an unauthenticated study to the network: a warning names it; on the
    default 127.0.0.1 there is none."""
    if command == "storage-proxy":
        pytest.importorskip("grpc", reason="grpcio is not installed")
    path = a_sweep_database(tmp_path)
    for host, warned in (("0.0.0.0", True), ("127.0.0.1", False)):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "ablate", command, "--storage", f"sqlite:///{path}",
                                 "--host", host, "--port", str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            banner = proc.stdout.readline()  # printed once it is about to listen
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert f":{port}" in banner and proc.returncode == 0, (banner, err)
        lines = [line for line in err.splitlines() if line.strip()]
        if warned:
            assert len(lines) == 1 and lines[0].startswith("ablate: warning: ") and "no authentication" in lines[0] \
                and "0.0.0.0" in lines[0] and str(path) in lines[0], err
        else:
            assert not lines, err


def test_dashboard_banner_masks_the_database_password():
    from sweeps.dashboard import banner

    line = banner("postgresql+psycopg2://ablate:hunter2@db.example:5432/optuna", "::1", 8080)
    assert "hunter2" not in line and "ablate:***@db.example:5432/optuna" in line and "http://[::1]:8080/" in line


def fake_table3_study(path: Path, rows: list[str], preset: str = "tiny", dev_lines: int = 0) -> None:
    """A Table 3 study as `ablate table3` leaves it, with one complete run of each of `rows` (and
    the numbers a report reads; `dev_lines` dev translations each, none by default: no bootstrap)."""
    from ablations.spec import load_spec
    from foundation.schema import SCHEMA
    from foundation.records import pack_lines

    dev = {"dev_hyp": pack_lines([f"sentence {i}" for i in range(dev_lines)]),
           "dev_ref": pack_lines([f"sentence {i}" for i in range(dev_lines)])} if dev_lines else {}

    spec = load_spec()
    study = optuna.create_study(study_name=f"table3-{preset}", storage=f"sqlite:///{path}")
    for key, value in {"schema": SCHEMA, "kind": "table3", "preset": preset, "spec": spec, "overrides": [], "config": None,
                       "setup": {"scale": {"width": 0.25, "depth": 0.5, "steps": 0.02}}}.items():
        study.set_user_attr(key, value)
    for i, row in enumerate(rows):
        trial = study.ask()
        for key, value in {"row": row, "seed": 1, "group": spec[row].get("group", row), "ppl": 10.0 + i,
                           "bleu": 5.0 - i, "params": 1000, "steps": 10, "train_time_s": 1.0,
                           "tokens_per_s": 100.0, **dev}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 10.0 + i)


def test_report_without_a_base_run_warns_in_one_line_and_reports_the_other_rows(tmp_path: Path, capsys):
    """Without base there is no change against base, but the rows' own PPL and BLEU beside the
    paper's are still worth reading (a table whose base is still training): a warning, not silence."""
    fake_table3_study(tmp_path / "t.db", ["A1", "B1"])
    assert main(["report", "--storage", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ablate: warning: study 'table3-tiny' has no complete base run")
    table = (tmp_path / "r" / "table3.md").read_text()
    assert "Incomplete: the study 'table3-tiny' has no complete base run" in table
    assert "| A1    | h 1, d_k 512, d_v 512 |" in table and "| B1    |" in table  # changes from the spec's base


def test_report_of_a_table_with_no_complete_run_is_an_error(tmp_path: Path, capsys):
    fake_table3_study(tmp_path / "t.db", [])
    assert main(["report", "--storage", f"sqlite:///{tmp_path / 't.db'}", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == "ablate: error: study 'table3-tiny' has no complete runs yet: nothing to report\n"
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- the command line's help

def commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every (sub)command: its parser and its one-line summary in its parent's --help."""
    found = {}
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        summaries = {a.dest: a.help for a in action._choices_actions}
        for name, sub in action.choices.items():
            found[f"{prefix}{name}"] = (sub, summaries.get(name) or "")
            found.update(commands(sub, f"{prefix}{name} "))
    return found


COMMANDS = sorted(commands(build_parser()))


def test_every_command_is_listed_with_a_summary_and_described_in_its_own_help():
    assert {"train", "sweep", "sweep optuna", "sweep wandb", "table3", "report", "dashboard",
            "storage-proxy", "params", "translate", "evaluate", "attention"} == set(COMMANDS)
    for name, (parser, summary) in commands(build_parser()).items():
        assert summary and "\n" not in summary, name
        assert parser.description and len(parser.description) > len(summary) + 20, name
        assert parser.description.lower().startswith(summary.lower()), name


@pytest.mark.parametrize("name", COMMANDS)
def test_command_help_prints_its_description(name: str, capsys):
    assert main([*name.split(), "--help"]) == 0
    out = capsys.readouterr().out
    parser, _ = commands(build_parser())[name]
    assert " ".join(parser.description.split()[:6]) in " ".join(out.split())


def test_preset_help_lists_the_presets_and_devices_help_says_what_it_means(capsys):
    from ablations.spec import preset_names

    for name in ("train", "table3", "sweep optuna", "sweep wandb"):
        main([*name.split(), "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert all(preset in out.split("--preset PRESET", 2)[-1][:200] for preset in preset_names()), name
        one_worker_per_gpu = "--gpus IDS GPU ids to spread the workers over, one worker per id" in out
        assert one_worker_per_gpu == (name in ("table3", "sweep optuna")), name
        assert ("--devices DEVICES devices the run trains on (Lightning's)" in out) == (not one_worker_per_gpu), name


def test_every_option_shows_its_default_and_table3_says_its_preset(capsys):
    """One vocabulary: --help of every command names each option's default (those that have one),
    and `table3`'s description says that its preset is tiny unless given."""
    import argparse

    for name, (parser, _) in commands(build_parser()).items():
        main([*name.split(), "--help"])
        out = " ".join(capsys.readouterr().out.split())
        for action in parser._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) \
                    and not isinstance(action, argparse._HelpAction):
                text = " ".join((action.help or "").split())
                assert "default" in text.lower() or f"(default: {action.default})" in out.replace("- ", "-"), \
                    (name, action.dest)
    main(["table3", "--help"])
    assert "The preset is tiny unless --preset says otherwise" in " ".join(capsys.readouterr().out.split())


def test_a_notebook_gets_the_same_name_rule_and_paths_stay_inside(tmp_path: Path):
    """The library entry point checks the study name as the command line does, before it writes
    anything; and a path built from names is refused once it leads outside its folder."""
    from foundation.errors import UserError
    from foundation.names import check_name, inside
    from tables.plan import make_plan

    with pytest.raises(UserError, match="bad study name '../escape'"):
        make_plan("demo", f"sqlite:///{tmp_path}/s.db", str(tmp_path / "runs"), [], study="../escape")
    assert not list(tmp_path.iterdir())
    assert inside(tmp_path, "study", "base-s1") == (tmp_path / "study" / "base-s1").resolve()
    for parts in (("..", "x"), ("a", "../../x"), ("/etc",)):
        with pytest.raises(UserError, match="leads outside"):
            inside(tmp_path, *parts)
    for good in ("base", "A1", "table3-cpu", "pre_ln", "big+", "C5.v2"):
        assert check_name(good, "row name") == good
    for bad in ("", ".", "..", ".hidden", "a/b", "a b", "a\0b", "x" * 65, 3):
        with pytest.raises(UserError):
            check_name(bad, "row name")


# --- Ownership: a command writes, replaces and deletes only its own files, in folders of its own,
# and never through a symbolic link (foundation/io.py: not_a_link, check_kinds;
# rundir.check_entries, rundir.refuse_foreign)

def snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every path under `root` (links not followed): its kind and its bytes or link target."""
    found = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_dir():
                found[key] = ("dir", b"")
            else:
                found[key] = ("file", path.read_bytes())
    return found


def our_run(tmp: Path) -> Path:
    """A run directory of ours (its marker) that has not trained yet."""
    run = tmp / "run"
    run.mkdir()
    (run / "ablate-run.json").write_text('{"format": "ablate run directory"}')
    return run


def users_files(tmp: Path) -> Path:
    """A folder of the user's own, with a file that must survive every case."""
    mine = tmp / "mine"
    mine.mkdir()
    for name in ("notes.txt", "metrics.csv", "keep.txt"):
        (mine / name).write_text(f"the user's {name}\n")
    return mine


def lock_is_a_link(tmp: Path) -> Path:
    run = our_run(tmp)
    (run / ".ablate-run.lock").symlink_to(users_files(tmp) / "notes.txt")
    return run


def logs_is_a_link(tmp: Path) -> Path:
    run = our_run(tmp)
    (run / "logs").symlink_to(users_files(tmp))
    return run


def metrics_is_a_link(tmp: Path) -> Path:
    run = our_run(tmp)
    (run / "logs").mkdir()
    (run / "logs" / "metrics.csv").symlink_to(users_files(tmp) / "metrics.csv")
    return run


def only_hidden_files(tmp: Path) -> Path:
    folder = tmp / "project"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "config").write_text("[core]\n")
    (folder / ".env").write_text("SECRET=1\n")
    (folder / ".draft.tmp").write_text("half a thought\n")
    return folder


def our_run_with(tmp: Path, name: str, kind: str) -> Path:
    """Our run directory whose `name` is of the wrong `kind` (a file where we keep a folder...)."""
    run = our_run(tmp)
    if kind == "dir":
        (run / name).mkdir()
    else:
        (run / name).write_text("x\n")
    return run


OWNERSHIP = [
    ("lock-is-a-link", lock_is_a_link, "is a symbolic link"),
    ("logs-is-a-link", logs_is_a_link, "is a symbolic link"),
    ("metrics-csv-is-a-link", metrics_is_a_link, "is a symbolic link"),
    ("out-holds-only-hidden-files", only_hidden_files, "(it holds .draft.tmp, .env, .git and no ablate-run.json)"),
    ("checkpoints-is-a-file", lambda t: our_run_with(t, "checkpoints", "file"), "checkpoints is not a directory"),
    ("logs-is-a-file", lambda t: our_run_with(t, "logs", "file"), "logs is not a directory"),
    ("results-json-is-a-directory", lambda t: our_run_with(t, "results.json", "dir"), "results.json is a directory"),
    ("lock-is-a-directory", lambda t: our_run_with(t, ".ablate-run.lock", "dir"), ".ablate-run.lock is a directory"),
]


@pytest.mark.parametrize("case", OWNERSHIP, ids=[c[0] for c in OWNERSHIP])
def test_train_never_writes_through_a_link_nor_into_a_folder_not_its_own(case, tmp_path: Path, monkeypatch, capsys):
    """`ablate train --out` on a folder it may not write as it stands: one line, exit 2, before any
    work, and not one byte under tmp_path changed (the user's files behind the links included)."""
    name, build, expected = case
    monkeypatch.chdir(tmp_path)
    out = build(tmp_path)
    before = snapshot(tmp_path)
    code = main(["train", "--out", str(out), *FAST])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ablate: error: "), (code, err)
    assert expected in err[0], err[0]
    assert snapshot(tmp_path) == before


def test_stale_temporaries_removed_are_ours_only(tmp_path: Path):
    """A run of ours removes the temporary files its killed writes left (mkstemp's
    `.NAME.XXXXXXXX.tmp`), never a user's `.draft.tmp`, nor through a link."""
    from lightning_modules.run.preflight import remove_stale_temporaries

    mine = users_files(tmp_path)
    run = our_run(tmp_path)
    (run / ".draft.tmp").write_text("mine\n")
    (run / ".results.json.k3x9q_b1.tmp").write_text("half")
    (run / ".config.yaml.a1b2c3d4.tmp").symlink_to(mine / "keep.txt")
    remove_stale_temporaries(run)
    assert sorted(p.name for p in run.iterdir()) == [".config.yaml.a1b2c3d4.tmp", ".draft.tmp", "ablate-run.json"]
    assert (mine / "keep.txt").read_text() == "the user's keep.txt\n"


TINY_MODEL = ["d_model=32", "d_ff=64", "n_heads=4", "n_layers=1", "data.vocab_size=500", "data.max_tokens=1000",
              "eval.max_len_offset=10"]


def _train(out: Path, corpus: list[str], *extra: str, steps: int = 2, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`ablate train` as a real process: a one-layer, 32-wide model on the session's small corpus."""
    args = [sys.executable, "-m", "ablate", "train", "--out", str(out), *FAST[:1], "--max-steps", str(steps),
            *FAST[3:], *TINY_MODEL, *corpus, *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=out.parent, env=env)


def test_damaged_files_of_ours_are_set_aside_in_one_line_each_and_never_deleted(tmp_path: Path, small_corpus, capfd):
    """A run directory of ours whose config.yaml is a list, whose spm.model is text and whose
    checkpoint does not load under weights_only: each is set aside as NAME.corrupt with one warning
    line, and the same command trains the run to the end (no traceback, no weights_only=False
    advice). Both commands run in this process (`ablate_here`): the files are the point, not a
    process (see tests/here.py for why Lightning is imported before any test runs)."""
    import torch

    out = tmp_path / "run"
    args = ["train", "--out", str(out), *FAST[:1], "--max-steps", "2", *FAST[3:], *TINY_MODEL, *small_corpus]
    first = ablate_here(capfd, *args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    (out / "results.json").unlink()
    (out / "config.yaml").write_text("- 1\n- 2\n")
    (out / "spm.model").write_text("not a model\n")
    torch.save({"state_dict": argparse.Namespace(x=1), "global_step": 9}, out / "checkpoints" / "last.ckpt")
    again = ablate_here(capfd, *args, cwd=tmp_path)
    err = again.stderr
    assert again.returncode == 0 and "Traceback" not in err and "weights_only=False" not in err, err
    warned = [line for line in err.splitlines() if line.startswith("ablate: warning: ")]
    for name in ("config.yaml", "spm.model", "last.ckpt"):
        assert (out / name if name != "last.ckpt" else out / "checkpoints" / name).with_name(f"{name}.corrupt").is_file()
        assert sum(f"{name} is damaged" in line for line in warned) == 1, warned
    assert json.loads((out / "results.json").read_text())["status"] == "complete"


def test_the_run_that_holds_the_folder_leaves_the_marker_another_command_is_writing(tmp_path: Path):
    """The race `test_two_commands_on_one_run_train_it_once` once lost: the command holding the run
    removes killed writes' temporary files, but not the marker's, which a second command starting
    at the same moment may be writing (it then finds the run taken and exits in one line)."""
    from lightning_modules.run.preflight import remove_stale_temporaries

    (tmp_path / "checkpoints").mkdir()
    marker_tmp = tmp_path / ".ablate-run.json.k3x9q_ab.tmp"
    killed = [tmp_path / ".results.json.a1b2e5f6.tmp", tmp_path / "checkpoints" / ".last.ckpt.c3d4g7h8.tmp"]
    for path in (marker_tmp, *killed):
        path.write_text("half")
    remove_stale_temporaries(tmp_path)
    assert marker_tmp.exists() and not any(path.exists() for path in killed)


@pytest.mark.parametrize("wait", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["refused", "waits"])
def test_two_commands_on_one_run_train_it_once(wait: bool, tmp_path: Path, small_corpus, capfd):
    """Two `ablate train` on one --out: one trains, the other names the process that holds the run
    and exits 1; with --wait (both started together) it waits and then reuses the finished run.
    Either way every logged window appears once and no stray `-v1` checkpoint is left. (Refused: the
    one that takes the run is a real process that holds itself after its first step,
    `ABLATE_FAULT=train_step@1:SIGSTOP`, until the other has exited, then trains on to the end: it
    holds the run for certain, not for as long as 300 steps happen to take. The other, refused
    before it trains, runs in this process (`ablate_here`): its refusal is the point, not a process.)"""
    out = tmp_path / "run"
    if wait:
        # long enough (a few seconds of training) that the second command starts while the first holds the run
        procs = [_train(out, small_corpus, "--wait", steps=300), _train(out, small_corpus, "--wait", steps=300)]
        results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
        assert sorted(code for code, _ in results) == [0, 0], results
    else:
        holder = _train(out, small_corpus, steps=3, env={**os.environ, "ABLATE_FAULT": "train_step@1:SIGSTOP"})
        try:
            wait_until_stopped(holder)  # it took the run and is held after step 1
            refused = ablate_here(capfd, "train", "--out", str(out), *FAST[:1], "--max-steps", "3", *FAST[3:],
                                  *TINY_MODEL, *small_corpus, cwd=out.parent)
            holder.send_signal(signal.SIGCONT)
            held = (holder.wait(timeout=300), holder.stderr.read())
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
        assert held[0] == 0 and refused.returncode == 1, (held, refused)
        err = refused.stderr
        assert err.count("\n") == 1 and "is being trained by pid " in err, err
        assert f"is being trained by pid {holder.pid} " in err, err
    rows = [tuple(line.split(",")) for line in (out / "logs" / "metrics.csv").read_text().splitlines()[1:]]
    assert rows and len(rows) == len(set(rows)), "a window logged twice"
    assert not list((out / "checkpoints").glob("*-v1*")), list((out / "checkpoints").iterdir())


@pytest.mark.parametrize("damage", ["wandb-a-file", "wandb-id-outside"])
def test_wandb_that_cannot_start_is_one_warning_and_the_run_completes(damage: str, tmp_path: Path, capfd):
    """W&B is never fatal (#72): a `wandb` in the run directory that is a file, or a wandb_id.txt
    that holds `../../outside`, had ended a trained run in a traceback without results.json. The
    first trains without W&B, the second under a new W&B run id, each with one warning line; nothing
    is written outside the run directory."""
    run = tmp_path / "work" / "run"
    run.mkdir(parents=True)
    from foundation.rundir import mark

    mark(run)
    if damage == "wandb-a-file":
        (run / "wandb").write_text("not a folder")
    else:
        (run / "wandb_id.txt").write_text("../../outside")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = ablate_here(capfd, "train", "--preset", "tiny", "--out", str(run), "--wandb", "offline", *FAST[1:])
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("ablate: warning: W&B")]
    assert len(warnings) == 1 and "Traceback" not in result.stderr, warnings
    assert json.loads((run / "results.json").read_text())["status"] == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not (tmp_path / "outside").exists()
    if damage == "wandb-id-outside":
        assert "holds no W&B run id ('../../outside')" in warnings[0]
        new_id = (run / "wandb_id.txt").read_text().strip()
        assert re.fullmatch(r"[a-z0-9]+", new_id) and any(run.glob(f"wandb/offline-run-*-{new_id}"))


def test_a_report_to_wandb_online_without_a_network_is_written_and_logged_offline(tmp_path: Path):
    """`ablate report --wandb-report online` with no way to reach W&B had waited 109 s, then printed
    a traceback: now W&B's init_timeout bounds the wait ($WANDB_INIT_TIMEOUT: 2 s here), one warning
    line, the report written and its W&B run kept offline in the report's folder; exit 0."""
    import time

    db = tmp_path / "t.db"
    fake_table3_study(db, ["base", "A1"])
    env = {**os.environ, "WANDB_API_KEY": "a" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_INIT_TIMEOUT": "2",
           "HOME": str(tmp_path / "home"), "WANDB_SILENT": "true"}
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "ablate", "report", "--storage", f"sqlite:///{db}", "--out",
                             str(tmp_path / "r"), "--wandb-report", "online"], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if line.startswith("ablate: warning: W&B online could not start")]
    assert len(warned) == 1 and "logging offline instead" in warned[0]
    assert (tmp_path / "r" / "table3.md").is_file() and list((tmp_path / "r" / "wandb").glob("offline-run-*"))
    assert time.monotonic() - start < 120


@contextmanager
def immutable(*paths: Path) -> Iterator[None]:
    """Folders and files no one may write, root included (`chattr +i`: a read-only disk or backup)."""
    done = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True)
    if done.returncode:
        pytest.skip(f"chattr +i is not available here: {done.stderr.decode()[:80]}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_reading_commands_read_a_database_and_folders_they_cannot_write(kind: str, tmp_path: Path, capsys,
                                                                          monkeypatch):
    """Read-only means read-only (#72): a report on a backup of a study that cannot be written, and
    a dry run from a folder that cannot be written; each had been refused because it wanted to write."""
    backup = tmp_path / "backup"
    backup.mkdir()
    fake_table3_study(tmp_path / "t.db", ["base", "A1"])
    if kind == "sqlite":
        shutil.copy(tmp_path / "t.db", backup / "t.db")
        url = f"sqlite:///{backup / 't.db'}"
    else:
        url = f"journal:///{backup / 't.journal'}"
        optuna.copy_study(from_study_name="table3-tiny", from_storage=f"sqlite:///{tmp_path / 't.db'}",
                          to_storage=optuna.storages.JournalStorage(
                              optuna.storages.journal.JournalFileBackend(str(backup / "t.journal"))))
    before = snapshot_of(backup)
    with immutable(*backup.iterdir(), backup):
        assert main(["report", "--storage", url, "--out", str(tmp_path / "r")]) == 0, capsys.readouterr().err
        monkeypatch.chdir(backup)
        assert main(["table3", "--preset", "demo", "--dry-run", "--storage", url]) == 0, capsys.readouterr().err
    assert (tmp_path / "r" / "table3.md").is_file() and snapshot_of(backup) == before


def snapshot_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("command", [["params"], ["params", "--json"]])
def test_a_full_output_is_one_line(command: list[str], tmp_path: Path):
    """`ablate params > /dev/full`: one line, exit 1 (a traceback before)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "ablate", *command], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip() == \
        "ablate: error: cannot write to the output (stdout): No space left on device", done.stderr


@pytest.mark.parametrize("name", ["a" * 5000, "\u00e9" * 250])
def test_a_folder_name_the_file_system_cannot_hold_is_one_line(name: str, tmp_path: Path, capsys):
    line_of = one_line_error(capsys, ["train", "--preset", "tiny", "--out", str(tmp_path / name), "--no-wandb"])
    assert "is longer than the file system allows (255 bytes a name" in line_of


def one_line_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    """The one stderr line of a command that refuses `args` with exit status 2."""
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("ablate: error:"), (args, code, err)
    return err[0]


def test_a_table_on_a_study_of_a_newer_schema_is_one_line(tmp_path: Path, capfd):
    """It had been two: Optuna's "Using an existing study" line before ours."""
    db = tmp_path / "t.db"
    fake_table3_study(db, ["base", "A1"])
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE study_user_attributes SET value_json = '2' WHERE key = 'schema'")
    result = ablate_here(capfd, "table3", "--preset", "tiny", "--rows", "base", "--storage", f"sqlite:///{db}",
                         "--runs-dir", str(tmp_path / "runs"), *FAST)
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "is of schema version 2, newer than" in lines[0], lines
