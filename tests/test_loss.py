"""The chunked label-smoothed loss: the log-softmax formula's values and gradients, in every
chunking and dtype, compiled and eager, without keeping an fp32 copy of the logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_modules import loss as loss_module
from lightning_modules.loss import label_smoothed_nll

PAD = 0


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook formulation: a log-softmax of the whole matrix in fp32."""
    lprobs = F.log_softmax(logits.reshape(-1, logits.size(-1)).float(), dim=-1)
    flat = target.reshape(-1)
    keep = flat != PAD
    nll = -lprobs.gather(1, flat.masked_fill(~keep, 0)[:, None])[:, 0]
    per_token = (1 - eps) * nll - eps * lprobs.mean(-1)
    return per_token[keep].sum(), nll[keep].sum().detach()


def batch(dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(4, 9, 37, generator=g) * 4).to(dtype).requires_grad_()
    target = torch.randint(1, 37, (4, 9), generator=g)
    target[1, 5:] = PAD
    target[3, 2:] = PAD
    return logits, target


# one row a chunk, several rows, and (fp32 in one chunk) the whole-matrix log-softmax
@pytest.mark.parametrize("chunk_elements", [37, 5 * 37, 1 << 24])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_values_and_gradients_are_the_log_softmax_formulas(monkeypatch, chunk_elements, eps):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", chunk_elements)
    logits, target = batch(torch.float32)
    loss, nll, n = label_smoothed_nll(logits, target, PAD, eps)
    (grad,) = torch.autograd.grad(loss, logits)
    ref_logits = logits.detach().clone().requires_grad_()
    ref_loss, ref_nll = reference(ref_logits, target, eps)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_logits)
    assert int(n) == int((target != PAD).sum())
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    assert grad[target == PAD].abs().sum() == 0
    assert not nll.requires_grad


def test_bf16_logits_get_a_bf16_gradient_equal_to_the_fp32_one_rounded(monkeypatch):
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 3 * 37)
    logits, target = batch(torch.bfloat16, seed=3)
    loss, _, _ = label_smoothed_nll(logits, target, PAD, 0.1)
    loss.backward()
    as_fp32 = logits.detach().float().requires_grad_()
    ref_loss, _ = reference(as_fp32, target, 0.1)
    ref_loss.backward()
    assert logits.grad.dtype == torch.bfloat16 and loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.grad, as_fp32.grad.to(torch.bfloat16), rtol=0, atol=0)


def test_keeps_no_fp32_copy_of_the_logits_for_the_backward_pass():
    logits, target = batch(torch.bfloat16, seed=4)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        label_smoothed_nll(logits, target, PAD, 0.1)
        reference(logits, target, 0.1)
    ours, theirs = saved[:4], saved[4:]  # ours: logits, target, keep, lse
    full = logits.numel()
    assert not any(t.dtype == torch.float32 and t.numel() >= full for t in ours)
    assert any(t.dtype == torch.float32 and t.numel() >= full for t in theirs)  # the check can fail


def test_compiled_formula_gives_the_chunked_values_and_gradients(monkeypatch):
    """The one-piece formula the loss takes when traced (dynamo + AOTAutograd, dynamic shapes):
    the chunked eager values and gradients. Traced without Inductor: the formula is what is checked
    here; Inductor's code for it runs in the compiled training step of tests/test_buckets.py's
    test_compiled_bucketed_step_matches_eager_on_cpu_fast, whose losses after each Adam step (its
    gradients) are the eager step's."""
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 4 * 37)  # eager: chunked, even in fp32
    logits, target = batch(torch.float32, seed=5)
    torch.compiler.reset()  # traced here, not taken from another test's compilation
    compiled = torch.compile(lambda x, y: label_smoothed_nll(x, y, PAD, 0.1)[:2], dynamic=True, backend="aot_eager")
    loss, nll = compiled(logits, target)
    (grad,) = torch.autograd.grad(loss, logits)
    eager_loss, eager_nll, _ = label_smoothed_nll(logits, target, PAD, 0.1)
    assert eager_loss.grad_fn.name().startswith("LabelSmoothedNLL")
    (eager_grad,) = torch.autograd.grad(eager_loss, logits)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, eager_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-5, atol=1e-6)


def test_the_compiled_loss_saves_no_fp32_logits_and_scatters_no_gradient(traced_graphs):
    """What the compiled step's loss costs on a GPU is bytes moved over the (N, V) logits: the
    textbook log-softmax saved its fp32 output for the backward pass and built the gradient by
    scattering into a zero-filled fp32 (N, V) tensor (16 % of a compiled base step on an H200).
    Traced here on a CPU, bf16 logits with N symbolic: the forward pass must hand the backward
    nothing V-wide in fp32, and the backward pass must form the gradient pointwise (no scatter)
    in the logits' dtype, in one graph each."""
    from lightning_modules.compiling import compile_dynamic

    backend, graphs = traced_graphs
    compiled = compile_dynamic(lambda x, y: label_smoothed_nll(x, y, PAD, 0.1)[:2], backend=backend)
    logits, target = batch(torch.bfloat16, seed=6)
    loss, _ = compiled(logits, target)
    (grad,) = torch.autograd.grad(loss, logits)
    assert len(graphs) == 2, graphs  # one forward, one backward
    forward, backward = graphs
    vocab = logits.size(-1)
    (outputs,) = [node.args[0] for node in forward.graph.nodes if node.op == "output"]
    wide = [node.meta["val"] for node in outputs if isinstance(node, torch.fx.Node)
            and isinstance(node.meta.get("val"), torch.Tensor)
            and node.meta["val"].dim() == 2 and node.meta["val"].size(-1) == vocab]
    assert all(t.dtype == torch.bfloat16 for t in wide), [(t.dtype, t.shape) for t in wide]
    targets = {str(node.target) for node in backward.graph.nodes if node.op == "call_function"}
    assert not any("scatter" in t or "new_zeros" in t for t in targets), sorted(targets)
    assert grad.dtype == torch.bfloat16
    ref_logits = logits.detach().float().requires_grad_()
    (ref_grad,) = torch.autograd.grad(reference(ref_logits, target, 0.1)[0], ref_logits)
    torch.testing.assert_close(grad, ref_grad.to(torch.bfloat16), rtol=0, atol=1e-2)


# --------------------------------------------------------------------------- projection and loss in chunks


def hidden_batch(seed: int, rows: int = 9) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states (4, rows, 8), a pre-softmax matrix (37, 8) and targets with padding."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(4, rows, 8, generator=g).requires_grad_()
    weight = torch.randn(37, 8, generator=g).requires_grad_()
    target = torch.randint(1, 37, (4, rows), generator=g)
    target[1, 5:] = PAD
    target[3, 2:] = PAD
    return hidden, weight, target


# one piece, pieces that do not divide the 36 rows (padding rows), more pieces than real tokens
@pytest.mark.parametrize("chunks", [1, 5, 8, 30])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_projected_chunks_give_the_full_logits_values_and_gradients(chunks, eps):
    from lightning_modules.loss import projected_label_smoothed_nll

    hidden, weight, target = hidden_batch(seed=6)
    loss, nll, n = projected_label_smoothed_nll(hidden, weight, target, PAD, eps, chunks)
    grads = torch.autograd.grad(2.5 * loss, (hidden, weight))  # the incoming gradient scales both
    ref_loss, ref_nll = reference(hidden @ weight.t(), target, eps)
    ref_grads = torch.autograd.grad(2.5 * ref_loss, (hidden, weight))
    assert int(n) == int((target != PAD).sum()) and not nll.requires_grad
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-5, atol=1e-5)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-5)
    assert grads[0][target == PAD].abs().sum() == 0


def test_projected_chunks_keep_no_logits_for_the_backward_pass():
    from lightning_modules.loss import projected_label_smoothed_nll

    hidden, weight, target = hidden_batch(seed=7)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        projected_label_smoothed_nll(hidden, weight, target, PAD, 0.1, 3)
        ours = len(saved)
        reference(hidden @ weight.t(), target, 0.1)
    logits = hidden.size(0) * hidden.size(1) * weight.size(0)
    assert ours and all(t.numel() < logits for t in saved[:ours])  # the gradients: (N, d) and (V, d)
    assert any(t.numel() >= logits for t in saved[ours:])  # the check can fail


def test_projected_chunks_under_bf16_autocast_are_the_fp32_loss_to_bf16_precision():
    from lightning_modules.loss import projected_label_smoothed_nll

    hidden, weight, target = hidden_batch(seed=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = projected_label_smoothed_nll(hidden, weight, target, PAD, 0.1, 4)
    grads = torch.autograd.grad(loss, (hidden, weight))
    ref_loss, _ = reference(hidden @ weight.t(), target, 0.1)
    ref_grads = torch.autograd.grad(ref_loss, (hidden, weight))
    assert loss.dtype == torch.float32 and [g.dtype for g in grads] == [torch.float32, torch.float32]
    torch.testing.assert_close(loss, ref_loss, rtol=2e-2, atol=0)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=0.05 * float(ref_grad.abs().max()))


def test_projected_chunks_compile_once_for_every_row_count():
    """Traced (dynamo + AOTAutograd, dynamic shapes): rows 36, 44, 28, 52 leave every remainder
    modulo 8 chunks, and one graph serves them all, with the eager values and gradients."""
    from lightning_modules.compiling import compile_dynamic, compiled_graphs
    from lightning_modules.loss import projected_label_smoothed_nll

    torch.compiler.reset()
    compiled = compile_dynamic(lambda h, w, t: projected_label_smoothed_nll(h, w, t, PAD, 0.1, 8)[:2],
                               backend="aot_eager")
    before = compiled_graphs()
    for seed, rows in enumerate((9, 11, 7, 13)):
        hidden, weight, target = hidden_batch(seed, rows)
        loss, nll = compiled(hidden, weight, target)
        grads = torch.autograd.grad(loss, (hidden, weight))
        eager_loss, eager_nll, _ = projected_label_smoothed_nll(hidden, weight, target, PAD, 0.1, 8)
        eager_grads = torch.autograd.grad(eager_loss, (hidden, weight))
        torch.testing.assert_close((loss, nll), (eager_loss, eager_nll), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(grads, eager_grads, rtol=1e-5, atol=1e-5)
    assert compiled_graphs() - before == 1
