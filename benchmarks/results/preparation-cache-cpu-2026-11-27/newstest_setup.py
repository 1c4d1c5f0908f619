"""The data part of a run's start-up in the H100 start-up measurement's setting (newstest2013+2014
repeated 8 times as training text, a shared 37,000-piece BPE, newstest2013 as dev): a first run on
an empty `data.cache_dir`, then the next run on the same cache, each in a fresh process, each
`TranslationData.setup()` as `ablate train` calls it. Prints and saves each run's stages (wall and
CPU seconds, peak RSS) and what came from the cache.

    python benchmarks/results/preparation-cache-cpu-2026-11-27/newstest_setup.py NEWSTEST_DIR OUT_JSON
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, sys, time
start = time.perf_counter()
from lightning_modules.config import DataConfig
from lightning_modules.data.prepared import TranslationData
files, cache, run = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
data = TranslationData(DataConfig(corpus="files", vocab_size=37000, max_tokens=25000, cache_dir=cache, **files), run)
data.setup()
print(json.dumps({"stages": data.stats["stages"], "prepared": data.stats["prepared"],
                  "setup_s": data.stats["setup_seconds"], "process_s": round(time.perf_counter() - start, 2),
                  "train_pairs": data.stats["train_pairs"], "vocab_size": data.stats["vocab_size"]}))
"""


def main() -> None:
    newstest, out = Path(sys.argv[1]), Path(sys.argv[2])
    repo = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(repo))
    from benchmarks.end_to_end import newstest_files

    with tempfile.TemporaryDirectory() as work:
        files = newstest_files(newstest, Path(work) / "text")
        runs = {}
        for name in ("first", "next"):
            done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(files), f"{work}/cache", f"{work}/{name}"],
                                  cwd=repo, capture_output=True, text=True, check=True)
            runs[name] = json.loads(done.stdout.strip().splitlines()[-1])
            stages = ", ".join(f"{s['stage']} {s['wall_s']:.2f} s (CPU {s['cpu_s']:.2f})" for s in runs[name]["stages"])
            print(f"{name}: setup {runs[name]['setup_s']:.2f} s, process {runs[name]['process_s']:.2f} s; {stages}; "
                  f"{runs[name]['prepared']}", flush=True)
    out.write_text(json.dumps(runs, indent=2) + "\n")


if __name__ == "__main__":
    main()
