"""The one place that touches torch.compile's settings and counters (and why each is needed).

- `torch.fx.experimental._config.use_duck_shape` (private): by default dynamo assumes that
  dimensions of equal size on the first call are the same symbol ("duck sizing"). A first batch
  whose source and target happen to have the same length then guards `src.size(1) ==
  tgt_in.size(1)`, and the next batch recompiles the whole step (1-2 minutes for the base model
  on an H100 host; seen as a third graph in benchmarks/results). Source and target lengths are
  independent, so duck sizing is switched off while the step is traced.
- `torch._dynamo.lookup_backend(name)`: the backend (Inductor unless asked), wrapped so that the fault
  point `compile` (tests: a signal in the middle of compilation) runs inside compilation itself.
- `torch._dynamo.utils.counters` (semi-private): the graph count that torch's own
  `TORCH_LOGS=recompiles` reports; results.json records it so a recompilation storm is visible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Recompilations beyond this are a bug (shapes are symbolic): fail loudly instead of silently
# compiling for minutes per batch.
RECOMPILE_LIMIT = 4


def compile_dynamic(fn: Callable[..., Any], backend: str = "inductor") -> Callable[..., Any]:
    """`torch.compile(fn, dynamic=True)` with independent symbolic sizes for every dimension.

    `backend` another of torch.compile's: "aot_eager" traces the same graphs, forward and backward,
    without Inductor's code generation (the benchmarks' CPU smoke check of GPU code paths)."""
    import torch.fx.experimental._config as fx_config

    fx_config.use_duck_shape = False
    dynamo = torch._dynamo.config
    if hasattr(dynamo, "recompile_limit"):  # torch >= 2.6 (cache_size_limit before)
        dynamo.recompile_limit = RECOMPILE_LIMIT
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):
        dynamo.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=True, backend=_with_fault_point(backend))


def _with_fault_point(backend: str) -> Callable[..., Any]:
    """The backend, with the `compile` fault point at the start of each compilation."""

    def compiler(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._dynamo import lookup_backend

        from lightning_modules.run.faults import inject

        inject("compile")
        return lookup_backend(backend)(graph, example_inputs)

    return compiler


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process (1 per compiled function when healthy)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
