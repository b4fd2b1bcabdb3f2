"""Does the longer spin kernel ahead of each timed replay (labkit.hardware.SPIN_CYCLES, 100k -> 1M cycles in stop 48)
change what short replays measure? The one-token lm_head and MoE layers replay in 27-110 us, far shorter than a
0.5 ms spin that keeps one SM busy while the others idle. Each leader (checked against its reference first) is timed
as the sweep times it (time_calls, 25 replays) behind 100k, 1M and 4M cycles, in two alternating rounds.

call as: python3 .device/spin_length.py [OUT_DIR]   (writes spin.csv and meta.json)
"""

import pandas as pd
from probe_points import leader_calls

import labkit.hardware as hardware
from labkit.bench import time_calls
from labkit.runs import probe_run

SPINS = (100_000, 1_000_000, 4_000_000)


def main():
    run = probe_run("spin-length")
    points = leader_calls(moe_tokens=(1, 8, 16), lm_head_tokens=(1, 8))
    rows = []
    for rnd in range(2):
        for name, err, calls in points:
            for spin in SPINS:
                hardware.SPIN_CYCLES = spin
                r = time_calls(calls, reps=25)
                rows.append({"point": name, "max_rel_err": err, "round": rnd, "spin_cycles": spin, **r})
                print(f"{name:32s} round {rnd} spin {spin:>9,d}: {r['us_graph']:8.1f} us "
                      f"({r['us_graph_p10']:.1f}-{r['us_graph_p90']:.1f}) {r['sm_mhz']} MHz", flush=True)
    d = pd.DataFrame(rows)
    with pd.option_context("display.width", 200):
        print(d.pivot_table(index="point", columns=["spin_cycles", "round"], values="us_graph").round(1).to_string())
    if run:
        run.finish_with("spin.csv: per leader point, round and spin length (cycles of the sleep kernel queued ahead "
                        "of each timed replay), the sweep's time_calls result", spin=d)


if __name__ == "__main__":
    main()
