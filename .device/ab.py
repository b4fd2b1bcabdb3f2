"""Device helper: compare two sweep run folders of the same spec (A = new tree, B = old tree), print per
problem/token count the best time of each and the median per-config ratio B/A (> 1: A faster).
usage: python3 .device/ab.py RUN_A RUN_B"""
import sys

import pandas as pd


def load(run):
    d = pd.read_parquet(f"{run}/points.parquet")
    key = "model" if "model" in d and d["model"].notna().any() else "n"
    d["prob"] = d[key].astype(str)
    return d


a, b = load(sys.argv[1]), load(sys.argv[2])
bad = pd.concat([a, b])
bad = bad[bad.status != "ok"]
if len(bad):
    print("NOT OK:", bad.groupby(["variant", "status"]).size().to_dict())
j = a[a.status == "ok"].merge(b[b.status == "ok"], on=["prob", "m", "variant", "config"], suffixes=("_a", "_b"))
j["r"] = j.us_graph_b / j.us_graph_a
rows = []
for (p, m), g in j.groupby(["prob", "m"]):
    rows.append({"problem": p, "m": m, "best_a": round(g.us_graph_a.min(), 1), "best_b": round(g.us_graph_b.min(), 1),
                 "median_b/a": round(g.r.median(), 3), "a_faster": f"{(g.r > 1).sum()}/{len(g)}"})
print(pd.DataFrame(rows).to_string(index=False))
print("all configs: median b/a", round(j.r.median(), 3), "mean", round(j.r.mean(), 3))
