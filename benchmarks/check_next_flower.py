"""Does the next Flower break us? One command, one verdict.

    python benchmarks/check_next_flower.py                 # the newest flwr-nightly
    python benchmarks/check_next_flower.py --flower release  # the newest flwr release
    python benchmarks/check_next_flower.py --flower "flwr==1.43.0"  # any requirement

Builds a scratch virtual environment in a fresh temporary directory outside the
repository (``python -m venv --system-site-packages``, so torch, Ray and everything else
come from this interpreter and nothing large is downloaded), installs only the candidate
Flower wheel into it (``pip install --no-deps``: it shadows the installed ``flwr``), then
runs, with the installed Flower ("baseline") and with the candidate:

1. the Flower-facing tests (``tests/app/test_flower_private.py`` — the one door to Flower's
   non-public API, ``fedrcl_flwr/app/wire/flower_private.py`` —, the privacy tests — Flower's
   DP wrappers, SecAgg+ workflow and client mods —, and the in-process runs through
   Flower's workflow API), without the tests that start real Flower processes;
2. the quickstart (``experiments/quickstart.yaml``) for 2 rounds under ``fedrcl-flwr run``
   (a real SuperLink, ServerApp and Ray simulation of the candidate Flower);

and compares the two runs' ``metrics.jsonl`` without timings (``wall_time_s``,
``round_time_s``). The verdict is ``OK`` when both test runs pass and the metrics are
identical, else ``BROKEN`` with what differed. The venv is removed at the end
(``--keep`` keeps it). Exit code 0 for OK, 1 for BROKEN, 2 for a setup failure (no
network to the package index, a wheel that does not install).

Needs the package index (``pip index versions``, ``pip install``); takes minutes (two
test runs and two short Flower runs). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOWER_TESTS = [
    "tests/app/test_flower_private.py",
    "tests/strategies/test_privacy.py",
    "tests/app/test_inprocess_runs.py",
]
TIMING_KEYS = ("wall_time_s", "round_time_s")
ROUNDS = 2


def newest(dist: str, pre: bool) -> str:
    """The newest version of ``dist`` on the package index (``pip index versions``)."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", dist] + (["--pre"] if pre else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.search(rf"^{re.escape(dist)} \(([^)]+)\)", out.stdout, re.M)
    if not m:
        raise SystemExit(f"check_next_flower: cannot find {dist} on the index: {out.stderr[-300:]}")
    return m.group(1)


def requirement(flower: str) -> str:
    if flower == "nightly":
        return f"flwr-nightly=={newest('flwr-nightly', pre=True)}"
    if flower == "release":
        return f"flwr=={newest('flwr', pre=False)}"
    return flower


def flower_version(python: str) -> str:
    code = "import flwr, importlib.metadata as m, pathlib; p = pathlib.Path(flwr.__file__).parent; "
    code += "d = [x.name for x in p.parent.glob('flwr*.dist-info')]; print(p, sorted(d))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    return (out.stdout or out.stderr).strip()


def run_env(venv_bin: Path | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    if venv_bin is not None:
        env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv_bin.parent)
    return env


def run_tests(python: str, env: dict, log: Path) -> tuple[bool, str]:
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not flwr and not slow"]
    with log.open("w") as fh:
        rc = subprocess.run(cmd + FLOWER_TESTS, cwd=REPO, env=env, stdout=fh, stderr=fh).returncode
    tail = [ln for ln in log.read_text().splitlines() if ln.strip()]
    return rc == 0, (tail[-1] if tail else f"exit {rc}")


def run_quickstart(python: str, env: dict, out: Path, log: Path) -> tuple[bool, list]:
    cmd = [python, "-m", "fedrcl_flwr.cli", "run", "experiments/quickstart.yaml", "--out", str(out)]
    cmd += ["--set", f"federation.rounds={ROUNDS}", "--set", "output.checkpoint_every=0"]
    cmd += ["--set", f"dataset.cache_dir={out.parent / 'cache'}"]
    with log.open("w") as fh:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=fh, stderr=fh).returncode
    metrics = out / "metrics.jsonl"
    if rc != 0 or not metrics.exists():
        return False, []
    recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    return True, [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in recs]


def first_difference(a: list, b: list) -> str:
    if len(a) != len(b):
        return f"{len(a)} records against {len(b)}"
    for i, (ra, rb) in enumerate(zip(a, b)):
        for k in sorted(set(ra) | set(rb)):
            if ra.get(k) != rb.get(k):
                return f"record {i + 1} key {k}: {ra.get(k)!r} against {rb.get(k)!r}"
    return "none"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--flower",
        default="nightly",
        help="nightly (newest flwr-nightly), release (newest flwr) or a pip requirement",
    )
    ap.add_argument("--keep", action="store_true", help="keep the scratch venv and runs")
    args = ap.parse_args(argv)

    req = requirement(args.flower)
    scratch = Path(tempfile.mkdtemp(prefix="fedrcl-next-flower-"))
    assert REPO not in scratch.parents, "the scratch venv must lie outside the repository"
    print(f"candidate: {req}; scratch: {scratch}", flush=True)
    try:
        venv = scratch / "venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True
        )
        vpy = str(venv / "bin" / "python")
        pip = subprocess.run(
            [vpy, "-m", "pip", "install", "-q", "--no-deps", req],
            capture_output=True,
            text=True,
        )
        if pip.returncode != 0:
            print(f"check_next_flower: pip install {req} failed: {pip.stderr[-500:]}")
            return 2
        sides = {
            "baseline": (sys.executable, run_env(None)),
            "candidate": (vpy, run_env(venv / "bin")),
        }
        results = {}
        for side, (py, env) in sides.items():
            print(f"{side}: {flower_version(py)}", flush=True)
            t0 = time.perf_counter()
            ok_tests, summary = run_tests(py, env, scratch / f"{side}-tests.log")
            print(f"  tests ({', '.join(FLOWER_TESTS)}): {summary}", flush=True)
            ok_run, recs = run_quickstart(
                py, env, scratch / f"{side}-run", scratch / f"{side}-run.log"
            )
            print(
                f"  quickstart, {ROUNDS} rounds: {'ok' if ok_run else 'FAILED'}"
                + (f", final test_accuracy {recs[-1].get('test_accuracy')}" if recs else "")
                + f" ({time.perf_counter() - t0:.0f} s with the tests)",
                flush=True,
            )
            results[side] = (ok_tests and ok_run, recs)
        same = results["baseline"][1] == results["candidate"][1] and results["baseline"][1]
        diff = first_difference(results["baseline"][1], results["candidate"][1])
        print(f"metrics.jsonl without timings: {'identical' if same else 'DIFFERENT: ' + diff}")
        ok = results["baseline"][0] and results["candidate"][0] and bool(same)
        if not ok and args.keep is False:
            print(f"  (logs are removed with the venv; rerun with --keep to read {scratch})")
        print(f"verdict: {'OK' if ok else 'BROKEN'} ({req} against flwr installed here)")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
