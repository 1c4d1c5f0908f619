"""The training step as the GPU needs it, checked on CPU: no per-step host reads, and a
recompilation recorded with the guard that failed. (That the Inductor-compiled step computes the
eager losses with one graph for every batch shape is tests/test_buckets.py's
test_compiled_bucketed_step_matches_eager_on_cpu_fast: exact-length and bucketed batches.)"""

from __future__ import annotations

import os
import sys

import lightning.pytorch as pl
import pytest
import torch
from torch.overrides import TorchFunctionMode

from lightning_modules.config import DataConfig, TrainConfig, TransformerConfig
from lightning_modules.data.datamodule import TranslationDataModule
from lightning_modules.translation import TranslationModule

# Tensor methods that copy a value to the host: on a GPU each one waits for every queued kernel.
HOST_READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__"}


class HostReads(TorchFunctionMode):
    """Records every tensor method call that reads a device value back to the host.

    On CPU every tensor is a host tensor, so the mode tracks which ones the module made host
    copies on purpose: the result of `.cpu()` / `.to("cpu")` and whatever is computed from such
    copies alone. Reads of those are free on a GPU too and are not recorded; reads of anything
    else are (the copy itself is recorded as a read). Reads inside `torch.optim` are left out:
    on CPU, Adam keeps its step counters as CPU tensors and reads them; on a GPU the module uses
    the fused CUDA Adam, which keeps them on the device (tests/test_gpu.py checks the whole step
    there with CUDA's own sync detector).
    """

    def __init__(self, host: set[int], alive: list[torch.Tensor]) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.host = host  # ids of host copies (kept alive in `alive`, so ids stay unique)
        self._alive = alive

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        from_host = bool(tensors) and all(id(t) in self.host for t in tensors)
        if name in HOST_READS and not from_host and not _inside_optimizer():
            self.calls.append(name)
        result = func(*args, **(kwargs or {}))
        if name in ("cpu", "to") and not from_host or from_host:
            for out in (result if isinstance(result, (tuple, list)) else (result,)):
                if isinstance(out, torch.Tensor) and out.device.type == "cpu":
                    self.host.add(id(out))
                    self._alive.append(out)
        return result


def _inside_optimizer() -> bool:
    """Whether the read was made by torch.optim's own code (the caller of the tensor method)."""
    return f"torch{os.sep}optim{os.sep}" in sys._getframe(2).f_code.co_filename


class CountHostReads(pl.Callback):
    """Host reads per training step: everything from one batch's start to the next's (forward,
    backward, Adam, Lightning's logging and progress bar, the next batch's loading)."""

    def __init__(self) -> None:
        self.per_step: dict[int, list[str]] = {}
        self._mode: HostReads | None = None
        self._host: set[int] = set()  # host copies made in earlier steps stay host copies
        self._alive: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._cut(trainer.global_step)
        self._mode = HostReads(self._host, self._alive)
        self._mode.__enter__()

    def on_train_end(self, trainer, pl_module) -> None:
        self._cut(trainer.global_step)

    def _cut(self, step: int) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self.per_step[step] = self._mode.calls
            self._mode = None


def ding(path, **data) -> TranslationDataModule:
    """The Ding corpus, set up for fitting; `data`: DataConfig fields beyond the small defaults."""
    dm = TranslationDataModule(DataConfig(vocab_size=500, max_tokens=1500, valid_size=100, test_size=100, **data),
                               path)
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def ding_data(tmp_path_factory) -> TranslationDataModule:
    return ding(tmp_path_factory.mktemp("run"))


def tiny(dm: TranslationDataModule, dropout: float = 0.1, model: dict | None = None,
         train: dict | None = None) -> TranslationModule:
    """A one-layer model; `model`, `train`: TransformerConfig and TrainConfig fields beyond its own."""
    return TranslationModule.from_configs(
        TransformerConfig(n_layers=1, d_model=32, d_ff=64, n_heads=4, dropout=dropout, vocab_size=dm.vocab_size,
                          **(model or {})),
        TrainConfig(warmup_steps=10, **(train or {})))


# The GPU round's eager variants that run on a CPU (benchmarks/gpu_round.py VARIANTS; the efficient
# and cuDNN attention kernels are CUDA's, and the compiled variants are checked on a GPU by
# tests/test_gpu.py with CUDA's sync detector): each keeps the step free of host reads.
# Each variant's settings by config section (model, train, data).
STEP_VARIANTS = {"default": {}, "attention math": {"model": {"attention_backend": "math"}},
                 "attention flash": {"model": {"attention_backend": "flash"}},
                 "fused QKV": {"model": {"fused_qkv": True}}, "loss chunks 8": {"train": {"loss_chunks": 8}},
                 "buckets 8": {"data": {"shape_buckets": 8}}}


@pytest.mark.parametrize("variant", list(STEP_VARIANTS))
def test_training_step_reads_the_device_only_at_log_steps(variant, ding_data, tmp_path):
    knobs = STEP_VARIANTS[variant]
    dm = ding(tmp_path, **knobs["data"]) if "data" in knobs else ding_data
    counter = CountHostReads()
    trainer = pl.Trainer(accelerator="cpu", max_steps=12, log_every_n_steps=5, limit_val_batches=0,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         callbacks=[counter])
    trainer.fit(tiny(dm, model=knobs.get("model"), train=knobs.get("train")), datamodule=dm)
    assert sorted(counter.per_step) == list(range(1, 13))
    log_steps = {5, 10, 12}  # every 5 steps, and the last
    for step, calls in counter.per_step.items():
        if step in log_steps:
            assert calls, f"step {step}: the window's values were not read"
        else:
            assert calls == [], f"step {step} read the device back: {calls}"


def test_a_recompilation_is_recorded_with_the_guard_that_failed():
    """One graph serves every length (no reason recorded); a call its guards refuse compiles again,
    and `recompile_reasons` names the function and the guard, as results.json keeps them."""
    from lightning_modules.compiling import compile_dynamic, compiled_graphs, recompile_reasons

    torch.compiler.reset()

    def doubled_sum(x):
        return (x * 2).sum()

    fn = compile_dynamic(doubled_sum, backend="aot_eager")
    before = compiled_graphs()
    fn(torch.randn(3))
    fn(torch.randn(5))
    assert compiled_graphs() - before == 1 and recompile_reasons() == []
    fn(torch.randn(4, dtype=torch.float64))
    assert compiled_graphs() - before == 2
    (reason,) = recompile_reasons()
    assert reason.startswith("doubled_sum: ") and "dtype mismatch" in reason, reason
    torch.compiler.reset()
    assert recompile_reasons() == []
