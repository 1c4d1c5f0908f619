"""The data code before and after the rehearsal's fixes on the same full-scale files, one
measurement per process (CPU seconds user + system, peak RSS from ru_maxrss):

    git show c8d87b3:lightning_modules/data/corpora.py > old_corpora.py   # the code before
    python before_after.py {old,new}-extract CACHE SCRATCH   # the three archives -> train.en/.de
    python before_after.py {old,new}-read CACHE              # train.en/.de -> the 1M-pair subset
    python before_after.py {old,new}-encode CACHE SPM        # the subset -> packed ids (read: new)

CACHE is a rehearsal run's data.cache_dir/wmt14 (`--keep`), SPM its run's spm.model."""
import resource, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))

def usage():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_maxrss / 1024

what, cache = sys.argv[1], Path(sys.argv[2])
cpu0, rss0 = usage()
start = time.perf_counter()
N = 1_000_000
if what.endswith("extract"):
    import os, shutil
    work = Path(sys.argv[3]); shutil.rmtree(work, ignore_errors=True); work.mkdir()
    for name in ("training-parallel-europarl-v7.tgz", "training-parallel-commoncrawl.tgz", "training-parallel-nc-v9.tgz"):
        os.link(cache / name, work / name)
    if what.startswith("old"):
        import old_corpora as c
        c.fetch_wmt14_train(work, c.WMT14_TRAIN_ARCHIVES)  # archives present: extraction only
    else:
        from lightning_modules.data import corpora as c
        c.extract_train(work, [(work / u.rsplit("/", 1)[-1], p) for u, p in c.WMT14_TRAIN_ARCHIVES])
    cpu1, rss1 = usage()
    print({"what": what, "cpu_s": round(cpu1 - cpu0, 1), "peak_rss_mb": round(rss1), "wall_s": round(time.perf_counter() - start, 1),
           "same": (work / "train.en").read_bytes() == (cache / "train.en").read_bytes()}, flush=True)
    shutil.rmtree(work)
    sys.exit()
if what.endswith("read") or what.endswith("encode"):
    if what == "old-read":
        import old_corpora as c
        text = c.subset(c.read_parallel(cache / "train.en", cache / "train.de"), N)
    else:
        from lightning_modules.data import corpora as c
        text = c.read_parallel(cache / "train.en", cache / "train.de", keep=N)
cpu1, rss1 = usage()
extra = {}
if what.endswith("encode"):
    import numpy as np
    from lightning_modules.data.tokenizer import load
    from lightning_modules.data.prepared import EncodedPairs, ENCODE_CHUNK
    sp = load(sys.argv[3])
    if what.startswith("old"):
        src, tgt = sp.encode(text.src, num_threads=2), sp.encode(text.tgt, num_threads=2)
        pairs = EncodedPairs(src, tgt)
    else:
        class T:  # the new chunked encoder without the rest of TranslationData
            pass
        from lightning_modules.data.prepared import TranslationData
        t = TranslationData.__new__(TranslationData); t.tokenizer = sp
        pairs = t._encode_split(text)
    cpu2, rss2 = usage()
    extra = {"encode_cpu_s": round(cpu2 - cpu1, 1), "peak_rss_mb_after_encode": round(rss2), "pieces": int(pairs.src_lengths.sum() + pairs.tgt_lengths.sum())}
print({"what": what, "pairs": len(text), "read_cpu_s": round(cpu1 - cpu0, 1), "peak_rss_mb_after_read": round(rss1),
       "wall_s": round(time.perf_counter() - start, 1), **extra}, flush=True)
