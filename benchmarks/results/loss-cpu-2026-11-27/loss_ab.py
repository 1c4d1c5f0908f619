"""The label-smoothed loss's forward + backward on CPU, eager, fp32: the code of a given commit
against the working tree's, side by side in one process (medians of 15 timed calls after 3 warm-up
calls; each side timed twice in alternating order, the faster kept).

    python benchmarks/results/loss-cpu-2026-11-27/loss_ab.py 0a4efee   # from the repository root
"""
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
from lightning_modules import loss as new  # noqa: E402

old_source = subprocess.run(["git", "show", f"{sys.argv[1]}:lightning_modules/loss.py"], capture_output=True,
                            text=True, check=True).stdout
old_path = Path(tempfile.mkdtemp()) / "loss_old.py"
old_path.write_text(old_source)
spec = importlib.util.spec_from_file_location("loss_old", old_path)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)


def median_s(fn, x, t, reps=15):
    times = []
    for _ in range(reps + 3):
        x.grad = None
        start = time.perf_counter()
        loss, _, _ = fn(x, t, 0, 0.1)
        loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:])


torch.manual_seed(0)
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
for rows, vocab in ((1495, 37000), (6000, 37000), (1495, 8000)):
    x = torch.randn(rows, vocab, requires_grad=True)
    t = torch.randint(1, vocab, (rows,))
    t[:50] = 0  # padding
    res = {"old": [], "new": []}
    for order in (("old", "new"), ("new", "old")):
        for name in order:
            res[name].append(median_s((old if name == "old" else new).label_smoothed_nll, x, t))
    o, n = min(res["old"]), min(res["new"])
    print(f"{rows} x {vocab}: old {o * 1e3:.1f} ms, new {n * 1e3:.1f} ms, new/old {n / o:.3f}", flush=True)
