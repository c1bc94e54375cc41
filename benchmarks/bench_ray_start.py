"""What a private Ray without the processes a simulation does not need
would save at start-up.

Flower's Ray backend starts the node itself (``ray.init`` with ``include_dashboard=False``;
``flwr/server/superlink/fleet/vce/backend/raybackend.py``); ``ray.init`` has no switch for
the autoscaler monitor or the log monitor. The only way to leave them out is to start the
node ourselves (``ray start --head --no-monitor --include-log-monitor=false
--include-dashboard=false``) and let Flower join it. This times both ways, each in fresh
processes, from nothing to the first task's result:

* ``flower``: ``ray.init(include_dashboard=False, num_cpus=N)`` in a fresh interpreter, as
  Flower's backend calls it (the clock stops at the first task's result: the node's
  teardown is not counted on either side);
* ``minimal``: ``ray start --head ... --block`` until it says the node is up, then a fresh
  interpreter joins it with ``ray.init(address=...)``.

Prints the median of ``--repeat`` trials of each and the ratio minimal/flower. Every
process it starts is stopped by its PID (``ray start --block`` takes its node down on
SIGTERM), and each trial gets its own ``--temp-dir``.

    python benchmarks/bench_ray_start.py --repeat 5
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

JOIN = """
import sys, time
import ray
ray.init(address=sys.argv[1] if len(sys.argv) > 1 else None, logging_level="ERROR",
         **({} if len(sys.argv) > 1 else {"include_dashboard": False, "num_cpus": %d}))
@ray.remote
def one():
    return 1
assert ray.get(one.remote()) == 1
print(f"READY {time.time():.6f}", flush=True)
ray.shutdown()
"""


def _env() -> dict:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    return env


def _join(code: str, *args: str) -> float:
    """Run a fresh driver; the wall-clock time (``time.time()``) at which its first task's
    result was in (its shutdown, which takes a node it started down with it, is not
    counted)."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=_env(), timeout=120
    )
    m = re.search(r"READY ([0-9.]+)", out.stdout)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"a Ray driver failed:\n{out.stderr[-2000:]}")
    return float(m.group(1))


def flower_way(cpus: int) -> float:
    t = time.time()
    return _join(JOIN % cpus) - t


def minimal_way(cpus: int) -> float:
    temp = tempfile.mkdtemp(prefix="bench_ray_")
    log = open(os.path.join(temp, "start.log"), "w+")
    t = time.time()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--head",
            "--port=0",
            f"--num-cpus={cpus}",
            "--include-dashboard=false",
            "--no-monitor",
            "--include-log-monitor=false",
            f"--temp-dir={temp}",
            "--block",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_env(),
        start_new_session=True,
    )
    try:
        address = None
        while address is None:
            if proc.poll() is not None or time.time() - t > 120:
                log.seek(0)
                raise SystemExit(f"ray start failed:\n{log.read()[-2000:]}")
            time.sleep(0.05)
            log.seek(0)
            m = re.search(r"address='([^']+)'", log.read())
            address = m.group(1) if m else None
        return _join(JOIN % cpus, address) - t
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cpus", type=int, default=2)
    a = ap.parse_args()
    times: dict[str, list[float]] = {"flower": [], "minimal": []}
    for i in range(a.repeat):  # interleaved, so that a busy minute hurts both
        times["flower"].append(flower_way(a.cpus))
        times["minimal"].append(minimal_way(a.cpus))
        print(
            f"trial {i + 1}: flower {times['flower'][-1]:.2f} s, "
            f"minimal {times['minimal'][-1]:.2f} s",
            flush=True,
        )
    f, m = (statistics.median(times[k]) for k in ("flower", "minimal"))
    print(
        f"start-up to the first task (median of {a.repeat}): flower's ray.init {f:.2f} s, "
        f"minimal ray start + join {m:.2f} s; minimal/flower = {m / f:.2f}"
    )


if __name__ == "__main__":
    main()
