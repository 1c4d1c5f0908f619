"""Beam search before and after it kept its alive sentences on the host, side by side in one
process, on the generation benchmark's model and batches (the demo-size model trained 400 steps
on Ding, 400 dev sentences in length-sorted batches of ~1,000 tokens), beam 4, alpha 0.6,
max length source + 50; greedy too. Runs alternate; both must give identical hypotheses.

    python benchmarks/results/beam-host-cpu-2026-11-26/before_after.py REV [REPS] > before_after.txt

REV: the commit whose lightning_modules/search.py is "before" (read with `git show`)."""
import importlib.util, json, subprocess, sys, tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from benchmarks.common import DEFAULT_CACHE, Settings, alternate, median, spread  # noqa: E402
from benchmarks.generation import ALPHA, BEAM, OFFSET, train_demo_model  # noqa: E402
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from lightning_modules.evaluate import length_batches  # noqa: E402
from lightning_modules import search as after  # noqa: E402

rev, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
text = subprocess.run(["git", "show", f"{rev}:lightning_modules/search.py"], cwd=REPO, check=True,
                      capture_output=True, text=True).stdout
path = Path(tempfile.mkdtemp()) / "search_before.py"
path.write_text(text)
spec = importlib.util.spec_from_file_location("search_before", path)
before = importlib.util.module_from_spec(spec)
sys.modules["search_before"] = before
spec.loader.exec_module(before)

torch.set_num_threads(1)
settings = Settings(device=torch.device("cpu"), precision="fp32", reps=None, quick=False,
                    cache_dir=DEFAULT_CACHE, multi30k_dir=None)
model, dm, info = train_demo_model(settings, 400, 3)
c = model.config
sources = [ids[: c.max_len - 1] + [EOS_ID] for ids in dm.encode(dm.corpus.valid.src[:400])]
batches = []
for index in length_batches([len(s) for s in sources], 1000):
    src = torch.full((len(index), max(len(sources[i]) for i in index)), PAD_ID)
    for row, i in enumerate(index):
        src[row, : len(sources[i])] = torch.tensor(sources[i])
    batches.append(src)

outputs = {}


def decode(module, beam):
    def go():
        outputs[(module.__name__, beam)] = [
            (h.tokens, h.log_prob, h.score) for src in batches
            for h in (module.beam_search(model, src, BOS_ID, EOS_ID, beam, ALPHA, OFFSET) if beam > 1
                      else module.greedy_search(model, src, BOS_ID, EOS_ID, OFFSET, ALPHA))]
    return go


runs = {"before, beam 4": decode(before, BEAM), "after, beam 4": decode(after, BEAM),
        "before, greedy": decode(before, 1), "after, greedy": decode(after, 1)}
times = alternate(runs, reps, settings.device)
same = {beam: outputs[("search_before", beam)] == outputs[("lightning_modules.search", beam)] for beam in (1, BEAM)}
rows = {name: {"sentences_per_s": len(sources) / median(t), "median_s": median(t), "spread": spread(t),
               "seconds": t} for name, t in times.items()}
print(json.dumps({"before": rev, "model": info, "sentences": len(sources), "batches": len(batches),
                  "threads": 1, "reps": reps, "identical": {"greedy": same[1], "beam 4": same[BEAM]},
                  "runs": rows}, indent=1))
for kind in ("beam 4", "greedy"):
    b, a = rows[f"before, {kind}"]["median_s"], rows[f"after, {kind}"]["median_s"]
    print(f"{kind}: before {len(sources) / b:.1f} sentences/s, after {len(sources) / a:.1f} ({b / a:.3f}x)")
