"""How fast one client trains on one thread, on two, and on one thread beside a
second training process: the yardstick of the cross-device goal.

The goal "cross-device steady round <= 0.80x the in-process runner's" assumed a 5-step
client trains ~1.5-1.8x faster on two threads than on one (measured: ~95 ms
against 137-169 ms), so that two one-thread actors would beat the two-thread sequential
runner by ~25 %. This measures that premise on the machine at hand, with the cross-device
regime's client (``cnn5``, 32x32x3 images, batch 10, 5 SGD steps, ``bench_regimes.py
--regime xdev``), the model and loss of the project, synthetic tensors (no data loading):

* ``one``: one thread, this process alone;
* ``two``: two threads (``torch.set_num_threads(2)``), this process alone;
* ``side by side``: two fresh processes of one thread each, training at the same time
  (two actors of a simulation on two cores).

Prints the median ms per client of each (``--repeat`` clients after ``--warmup``) and the
floor the premise implies: one client per actor-slot of the side-by-side time against the
two-thread time, i.e. the best steady ratio two one-thread actors can reach against the
two-thread runner on training alone.

    python benchmarks/bench_threads.py --repeat 40
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

STEPS, BATCH = 5, 10


def client_ms(threads: int, repeat: int, warmup: int) -> float:
    """Median wall time (ms) of one client's 5 SGD steps on ``threads`` threads."""
    import torch

    from fedrcl_flwr.models import build_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model("cnn5", num_classes=10, in_channels=3, image_size=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=1e-3)
    x, y = torch.randn(STEPS * BATCH, 3, 32, 32), torch.randint(0, 10, (STEPS * BATCH,))
    times = []
    for _ in range(warmup + repeat):
        t0 = time.perf_counter()
        for s in range(STEPS):
            xb, yb = x[s * BATCH : (s + 1) * BATCH], y[s * BATCH : (s + 1) * BATCH]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:]) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=40, help="clients timed per setting")
    ap.add_argument("--warmup", type=int, default=5, help="clients run before timing")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0:
        ap.error("--repeat must be >= 1 and --warmup >= 0")
    if args.child:  # one side of "side by side": one thread, its time on stdout
        print(f"{client_ms(1, args.repeat, args.warmup):.3f}")
        return 0
    one = client_ms(1, args.repeat, args.warmup)
    two = client_ms(2, args.repeat, args.warmup)
    cmd = [sys.executable, __file__, "--child", "--repeat", str(args.repeat)]
    cmd += ["--warmup", str(args.warmup)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=3600)[0] for p in procs]
    finally:
        for p in procs:  # stopped by PID if anything above failed
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        print("bench_threads: a side-by-side process failed", file=sys.stderr)
        return 1
    side = [float(o.strip()) for o in outs]
    pair = statistics.mean(side)
    print(f"one thread alone          {one:8.1f} ms per client")
    print(f"two threads alone         {two:8.1f} ms per client  (speed-up {one / two:.2f}x)")
    print(f"one thread, side by side  {pair:8.1f} ms per client  ({side[0]:.1f}, {side[1]:.1f})")
    print(
        "floor of two one-thread actors against the two-thread runner, training alone: "
        f"(side by side / 2) / two threads = {pair / 2 / two:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
