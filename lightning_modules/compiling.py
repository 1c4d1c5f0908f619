"""The one place that touches torch.compile's settings and counters, and why (benchmarks/README.md).

- `use_duck_shape` (private), off while tracing: dynamo would take a first batch's equal source and
  target lengths for one symbol, and the next batch would recompile the step (minutes for base).
- `lookup_backend(name)`: the backend wrapped so that the fault point `compile` runs inside
  compilation; Inductor takes torch.compile's `mode` as the patches `list_mode_options` lists.
- `triton.mix_order_reduction_non_strict_mode`: the mix-order reduction fusion guarded on the symbolic
  `rows * columns` (a recompilation past its threshold); this drops the check.
- `counters` and `guard_failures` (semi-private): the graphs built and why, which results keep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

INDUCTOR_PATCHES = {"triton.mix_order_reduction_non_strict_mode": True}
# recompilation reasons a result keeps (a storm repeats the same few), each cut to REASON_CHARS
REASONS_KEPT, REASON_CHARS = 8, 300
RECOMPILE_LIMIT = 4  # more is a bug (shapes are symbolic): fail loudly, not compile for minutes a batch


def compile_dynamic(fn: Callable[..., Any], mode: str = "default",
                    backend: str | Callable[..., Any] = "inductor") -> Callable[..., Any]:
    """`torch.compile(fn, dynamic=True)` with independent symbolic sizes; under reduce-overhead each
    call starts a new CUDA-graph step, so a step's outputs are never taken for the previous step's."""
    import torch.fx.experimental._config as fx_config

    fx_config.use_duck_shape = False
    dynamo = torch._dynamo.config
    if hasattr(dynamo, "recompile_limit"):  # torch >= 2.6 (cache_size_limit before)
        dynamo.recompile_limit = RECOMPILE_LIMIT
    if hasattr(dynamo, "fail_on_recompile_limit_hit"):
        dynamo.fail_on_recompile_limit_hit = True
    # A run's floats (dropout p, eps) are constants: traced as symbols, dynamo would meet one it must
    # know (nn.Embedding's norm_type) and trace the whole step again.
    dynamo.specialize_float = True
    compiled = torch.compile(fn, dynamic=True, backend=_with_fault_point(backend), mode=mode)
    if mode != "reduce-overhead":
        return compiled

    def step(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args, **kwargs)

    return step


def _with_fault_point(backend: str | Callable[..., Any]) -> Callable[..., Any]:
    """`backend` (Inductor in `mode`) with the `compile` fault point at each compilation's start."""

    def compiler(graph: torch.fx.GraphModule, example_inputs: list[Any], mode: str | None = None
                 ) -> Callable[..., Any]:
        from torch._dynamo import lookup_backend

        from foundation.faults import inject

        inject("compile")
        if backend != "inductor":
            return lookup_backend(backend)(graph, example_inputs)
        patches = {**known(INDUCTOR_PATCHES), **(torch._inductor.list_mode_options(mode, dynamic=True) if mode else {})}
        return lookup_backend("inductor")(graph, example_inputs, config_patches=patches)

    return compiler


def known(patches: dict[str, Any]) -> dict[str, Any]:
    """The patches this torch has (one it lacks fails every compilation; GPU machines run another torch)."""
    import torch._inductor.config as inductor_config

    def has(key: str) -> bool:
        holder: Any = inductor_config
        *path, name = key.split(".")
        for part in path:
            holder = getattr(holder, part, None)
        return holder is not None and hasattr(holder, name)

    return {key: value for key, value in patches.items() if has(key)}


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process (1 per compiled function when healthy)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def graph_traces() -> int:
    """Graphs AOTAutograd has begun tracing (more than `compiled_graphs()` where a trace was redone)."""
    from torch._dynamo.utils import counters

    return int(counters["aot_autograd"]["total"])


def recompile_reasons() -> list[str]:
    """The guards that failed since `torch.compiler.reset()`, as `TORCH_LOGS=recompiles` prints them."""
    from torch._dynamo.utils import guard_failures

    reasons = [f"{getattr(code, 'co_name', code)}: {reason}" for code, failed in guard_failures.items()
               for reason in failed]
    return [reason[:REASON_CHARS] for reason in reasons[:REASONS_KEPT]]
