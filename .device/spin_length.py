"""Does the longer spin kernel ahead of each timed replay (labkit.hardware.SPIN_CYCLES, 100k -> 1M cycles in stop 48)
change what short replays measure? The one-token lm_head and MoE layers replay in 27-110 us, far shorter than a
0.5 ms spin that keeps one SM busy while the others idle. Each leader (checked against its reference first) is timed
as the sweep times it (time_calls, 25 replays) behind 100k, 1M and 4M cycles, in two alternating rounds.

call as: python3 .device/spin_length.py [OUT_DIR]   (writes spin.csv and meta.json)
"""

import contextlib

from probe_points import leader_calls, timed_arms

import labkit.hardware as hardware
from labkit.runs import probe_run

SPINS = (100_000, 1_000_000, 4_000_000)


@contextlib.contextmanager
def behind(spin, calls):
    """The calls, timed behind a spin kernel of `spin` cycles (labkit.hardware.SPIN_CYCLES, restored after)."""
    before, hardware.SPIN_CYCLES = hardware.SPIN_CYCLES, spin
    try:
        yield calls
    finally:
        hardware.SPIN_CYCLES = before


def main():
    run = probe_run("spin-length")
    points = leader_calls(moe_tokens=(1, 8, 16), lm_head_tokens=(1, 8))
    d = timed_arms(points, {spin: lambda name, calls, spin=spin: behind(spin, calls) for spin in SPINS},
                   "spin_cycles")
    if run:
        run.finish_with("spin.csv: per leader point, round and spin length (cycles of the sleep kernel queued ahead "
                        "of each timed replay), the sweep's time_calls result", spin=d)


if __name__ == "__main__":
    main()
