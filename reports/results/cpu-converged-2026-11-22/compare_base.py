"""Old-base vs redone-base table: each row's ΔPPL [CI], beyond noise, sign = paper; p vs base (new)."""
import io, subprocess, sys
import pandas as pd
path = "reports/results/cpu-converged-2026-11-22/table3.csv"
old = pd.read_csv(io.StringIO(subprocess.run(["git", "show", f"{sys.argv[1]}:{path}"], capture_output=True, text=True, check=True).stdout), index_col="row")
new = pd.read_csv(path, index_col="row")
def d(f, r):
    return f"{f.loc[r,'d_ppl']:+.2f} [{f.loc[r,'d_ppl_low']:+.2f}, {f.loc[r,'d_ppl_high']:+.2f}]"
print("| row | paper ΔPPL | ΔPPL, old base | ΔPPL, redone base | beyond noise old → new | sign = paper old → new | ΔBLEU new | p vs base |")
print("|---|---|---|---|---|---|---|---|")
for r in new.index:
    if r == "base":
        print(f"| base | – | {old.loc[r,'ppl']:.2f} ± {old.loc[r,'ppl_ci']:.2f} | {new.loc[r,'ppl']:.2f} ± {new.loc[r,'ppl_ci']:.2f} | | | BLEU {old.loc[r,'bleu']:.2f} → {new.loc[r,'bleu']:.2f} | |")
        continue
    p = new.loc[r, "p_bleu_vs_base"]
    print(f"| {r} | {new.loc[r,'d_paper_ppl']:+.2f} | {d(old,r)} | {d(new,r)} | {old.loc[r,'beyond_noise']} → {new.loc[r,'beyond_noise']} | "
          f"{old.loc[r,'ppl_sign_agrees']} → {new.loc[r,'ppl_sign_agrees']} | {new.loc[r,'d_bleu']:+.2f} | {'' if pd.isna(p) else f'{p:.3f}'} |")
