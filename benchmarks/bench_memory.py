"""Peak memory (PSS: shared pages counted once) of a 500-client (2 %) vs a 100-client (5 %) simulation of the same
model and data (goal: ratio <= 1.2). Memory is summed over every process of the run
(SuperLink, simulation process, Ray workers). Prints the ratio as its last line.

    python benchmarks/bench_memory.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from _common import ROOT, run_cli_measuring


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    exp = str(ROOT / "experiments" / "quickstart.yaml")
    common = [
        "--set",
        f"federation.rounds={args.rounds}",
        "--set",
        "client.local_epochs=1",
        "--set",
        "output.checkpoint_every=0",
    ]
    peaks = {}
    for clients, part in [(100, 0.05), (500, 0.02)]:
        with tempfile.TemporaryDirectory() as out:
            rc, wall, peak = run_cli_measuring(
                [
                    exp,
                    "--out",
                    out,
                    "--set",
                    f"federation.num_clients={clients}",
                    "--set",
                    f"federation.participation={part}",
                    *common,
                ]
            )
        if rc != 0:
            print(f"run with {clients} clients failed (exit {rc})", file=sys.stderr)
            return 1
        peaks[clients] = peak
        print(
            f"{clients} clients @ {part:.0%}: peak memory {peak / 2**20:.0f} MiB, wall {wall:.0f}s"
        )
    print(f"memory ratio 500 vs 100 clients: {peaks[500] / peaks[100]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
