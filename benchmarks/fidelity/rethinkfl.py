"""Side by side with FPL's code (WenkeHuang/RethinkFL): the same small Digits
files in their on-disk formats, the same protocol, FedAvg and FPL, several seeds; prints
the accuracy table (mean ± sd over seeds, difference, Welch 95 % interval).

    python benchmarks/fidelity/rethinkfl.py --authors-code PATH/TO/RethinkFL

``PATH`` is a checkout of their repository (never vendored here: nothing of it is copied
into the project). Their side runs their ``main.py`` unchanged in a subprocess (cwd =
their checkout) through a small launcher that applies these shims, all for running on
this machine's CPU with these files, none touching their split, training or evaluation:

* ``setproctitle`` (not installed here): a stand-in module that does nothing;
* ``utils.conf.data_path()`` (hard-coded ``F://dataset/pic_cls/``): the files' folder;
* ``FedLeaDigits.percent_dict``: every domain ``--fraction`` (theirs 0.01 of the full sets);
* ``resnet10`` as their ``get_backbone`` calls it: ``resnet10(10, nf=--nf)`` (theirs 64);
* ``best_args['fl_digits'][*]['local_lr']``: ``--lr`` (theirs 0.01; ours gets the same);
* torchvision's ``SVHN._check_integrity``: true, ``SVHN.download``: nothing (the files
  are ours, not the release's; their ``download=True`` would otherwise fetch it);
* ``torch.set_num_threads``: kept at ``--threads`` (their ``main`` asks for 4);
* ``FedLeaDigits.get_data_loaders`` gets the domain list as a Python list: their
  ``selected_domain_list == []`` on the NumPy array ``np.random.choice`` returns raises
  under NumPy >= 1.25 (an element-wise comparison; older NumPy answered ``False``);
* ``np.array`` as ``models/fpl.py`` sees it: a list of torch tensors becomes a 1-d object
  array, as older NumPy made of their per-class cluster lists (``np.array(all_f)``,
  ragged when classes have different numbers of clusters; NumPy >= 1.24 refuses
  ragged lists); every other call is NumPy's own.

Our side runs the same protocol in process (``fedrcl_flwr.app.inprocess.run_inprocess``:
the real strategy and clients, no Flower runtime) from an experiment in the form of
``experiments/rethinkfl/fpl_digits.yaml``: ``generator: rethinkfl_digits`` (their split,
client for client), ``resnet10_bn``, FPL with ``mean_over: batch``, ``proto_source:
last_epoch``, τ 0.02. Metric: both sides' global model each round on each domain's test
set, the unweighted mean over the four domains (their ``global_evaluate`` mean); the table
gives the last round and the mean of the last three rounds.

The data (no download): scikit-learn's 1 797 handwritten 8x8 digits, cut into four
disjoint pools, one per domain, each drawn in its domain's format and style: MNIST (28x28
grey idx files), USPS (16x16 grey, libsvm text in bz2), SVHN (32x32 colour on random
colours, .mat), SynthDigits (32x32 colour, inverted, noisy; PNG ImageFolder train/val).
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DOMAINS = ["mnist", "usps", "svhn", "syn"]

# ------------------------------------------------------------------------------ the data


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(img).resize((size, size), Image.BILINEAR))


def write_files(root: Path, test_per_domain: int = 60, seed: int = 0, exact: bool = False) -> dict:
    """The four domains under ``root`` in both layouts (theirs: USPS / SVHN files in the
    data folder itself; ours: ``usps/``, ``svhn/``). Returns the sizes.

    ``exact`` (the lockstep harness): images both sides bring to 32 px identically — MNIST
    drawn in a 32-px box (their ``Resize((32, 32))`` and ours leave it as it is) and USPS
    on 16 grey levels (multiples of 16), for which Pillow's bilinear 16 -> 32 upscaling
    (two passes, each rounded to 8 bits) and ours (one float pass, rounded once) give the
    same pixels; on other grey levels they differ by at most one level on some pixels."""
    from PIL import Image
    from scipy.io import savemat
    from sklearn.datasets import load_digits

    d = load_digits()
    x8 = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    y = d.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    pools = np.array_split(rng.permutation(len(y)), 4)
    sizes = {}
    for name, pool in zip(DOMAINS, pools):
        tr, te = pool[test_per_domain:], pool[:test_per_domain]
        sizes[name] = (len(tr), len(te))
        if name == "mnist":
            raw = root / "MNIST" / "raw"
            raw.mkdir(parents=True, exist_ok=True)
            box = 32 if exact else 28
            for prefix, idx in (("train", tr), ("t10k", te)):
                imgs = np.stack([_resize(x8[i], 20) for i in idx])
                m = (box - 20) // 2
                imgs = np.pad(imgs, ((0, 0), (m, m), (m, m)))  # MNIST's 20 px in a 28 box
                (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
                    struct.pack(">IIII", 2051, len(idx), box, box) + imgs.tobytes()
                )
                (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
                    struct.pack(">II", 2049, len(idx)) + y[idx].astype(np.uint8).tobytes()
                )
        elif name == "usps":
            (root / "usps").mkdir(parents=True, exist_ok=True)
            for fname, idx in (("usps.bz2", tr), ("usps.t.bz2", te)):
                lines = []
                for i in idx:
                    g = _resize(x8[i], 16).astype(np.float64)
                    if exact:  # 16 levels, written so that torchvision decodes them exactly
                        g = np.minimum(np.rint(g / 16) * 16, 240) + 0.5
                    v = g / 255 * 2 - 1
                    feats = " ".join(f"{j + 1}:{a:.6f}" for j, a in enumerate(v.ravel()))
                    lines.append(f"{int(y[i]) + 1} {feats}\n")
                blob = bz2.compress("".join(lines).encode())
                (root / "usps" / fname).write_bytes(blob)
                (root / fname).write_bytes(blob)
        elif name == "svhn":
            (root / "svhn").mkdir(parents=True, exist_ok=True)
            for fname, idx in (("train_32x32.mat", tr), ("test_32x32.mat", te)):
                imgs = []
                for i in idx:
                    g = _resize(x8[i], 32).astype(np.float64)[..., None] / 255
                    bg, fg = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
                    imgs.append((bg * (1 - g) + fg * g).clip(0, 255).astype(np.uint8))
                lab = y[idx].copy()
                lab[lab == 0] = 10  # SVHN's label for the digit 0
                mat = {"X": np.stack(imgs, axis=-1), "y": lab.astype(np.uint8)[:, None]}
                savemat(root / "svhn" / fname, mat)
                savemat(root / fname, mat)
        else:
            for split, idx in (("train", tr), ("val", te)):
                for k, i in enumerate(idx):
                    g = 255 - _resize(x8[i], 32).astype(np.float64)
                    im = np.stack([g, g * 0.6, 255 - g], -1) + rng.normal(0, 20, (32, 32, 3))
                    out = root / "syn" / split / str(int(y[i]))
                    out.mkdir(parents=True, exist_ok=True)
                    Image.fromarray(im.clip(0, 255).astype(np.uint8)).save(out / f"{k:04d}.png")
    return sizes


# ----------------------------------------------------------------------------- theirs

LAUNCHER = r"""
import sys, types
sys.modules.setdefault("setproctitle", types.SimpleNamespace(setproctitle=lambda *a: None))
import torch
torch.set_num_threads({threads})
torch.set_num_threads = lambda n: None
import torchvision.datasets as tvd
tvd.SVHN._check_integrity = lambda self: True
tvd.SVHN.download = lambda self: None
sys.path.insert(0, ".")
import utils.conf as conf
conf.data_path = lambda: {data!r}
import datasets.digits as digits
from backbone.ResNet import resnet10
digits.FedLeaDigits.percent_dict = {{d: {fraction} for d in {domains!r}}}
digits.resnet10 = lambda n: resnet10(n, nf={nf})
_loaders = digits.FedLeaDigits.get_data_loaders
digits.FedLeaDigits.get_data_loaders = lambda self, sel=[]: _loaders(self, list(sel))
import numpy as np, torch as _t
import utils.best_args as ba
for _m in ba.best_args["fl_digits"].values():
    _m["local_lr"] = {lr}
import models.fpl as fpl
def _array(x, *a, **k):
    if isinstance(x, list) and x and all(isinstance(v, _t.Tensor) for v in x):
        out = np.empty(len(x), dtype=object)
        for i, v in enumerate(x):
            out[i] = v
        return out
    return np.array(x, *a, **k)
fpl.np = types.SimpleNamespace(**{{n: getattr(np, n) for n in dir(np) if not n.startswith("__")}})
fpl.np.array = _array
import main
main.main()
"""


def run_theirs(authors: Path, data: Path, method: str, seed: int, a) -> list:
    code = LAUNCHER.format(
        threads=a.threads,
        data=str(data) + "/",
        fraction=a.fraction,
        domains=DOMAINS,
        nf=a.nf,
        lr=a.lr,
    )
    argv = [
        "--dataset", "fl_digits", "--model", method, "--seed", str(seed),
        "--parti_num", str(a.clients), "--communication_epoch", str(a.rounds),
        "--local_epoch", str(a.local_epochs),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": str(a.threads)}
    res = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=authors,
        capture_output=True,
        text=True,
        env=env,
    )
    accs = [float(v) for v in re.findall(r"Communcation Accuracy: ([0-9.]+)", res.stdout)]
    if res.returncode or len(accs) != a.rounds:
        sys.exit(
            f"their run failed (rc {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        )
    return accs


# ------------------------------------------------------------------------------- ours


def experiment(data: Path, method: str, seed: int, a, cache: Path) -> dict:
    params = (
        {"tau": 0.02, "lam": 1.0, "mean_over": "batch", "proto_source": "last_epoch"}
        if method == "fpl"
        else {}
    )
    return {
        "name": f"rethinkfl_side_{method}_{seed}",
        "seed": seed,
        "dataset": {
            "name": "digit5",
            "root": str(data),
            "domains": DOMAINS,
            "verify_md5": False,
            "image_size": 32,
            "normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
            "crop_pad": 4,
            "flip": True,
            "pad_fill": "black",
            "cache_dir": str(cache),
        },
        "partition": {
            "scheme": "domain",
            "generator": "rethinkfl_digits",
            "domain_fraction": a.fraction,
        },
        "model": {"name": "resnet10_bn", "params": {"nf": a.nf}},
        "federation": {
            "num_clients": a.clients,
            "rounds": a.rounds,
            "participation": 1.0,
            "eval_every": 1,
        },
        "client": {
            "method": method,
            "params": params,
            "optimizer": "sgd",
            "lr": a.lr,
            "lr_decay": 1.0,  # theirs: no schedule (the schema's default is FedRCL's 0.998)
            "momentum": 0.9,
            "weight_decay": 1.0e-5,
            "local_epochs": a.local_epochs,
            "batch_size": 64,
            "device": "cpu",
        },
        "server": {"strategy": "fedavg", "weighting": "samples"},
        "evaluation": {"batch_size": 64, "report_metric": "final", "target_rounds": [a.rounds]},
        "output": {"checkpoint_every": 0},
    }


def run_ours(data: Path, method: str, seed: int, a, work: Path) -> list:
    import torch
    import yaml

    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.config import load_config
    from fedrcl_flwr.run.results import read_metrics

    torch.set_num_threads(a.threads)
    exp = work / f"ours_{method}_{seed}.yaml"
    exp.write_text(yaml.safe_dump(experiment(data, method, seed, a, work / "cache")))
    out = work / f"ours_{method}_{seed}"
    run_inprocess(load_config(exp), out)
    recs = [r for r in read_metrics(out) if isinstance(r.get("domain_accuracy"), dict)]
    return [100 * float(r["domain_accuracy"]["average"]) for r in recs]


# ------------------------------------------------------------------------------ table


def welch(a: list, b: list) -> tuple[float, float, float]:
    """Difference of means and its Welch 95 % interval."""
    from scipy import stats

    a_, b_ = np.asarray(a, float), np.asarray(b, float)
    d = a_.mean() - b_.mean()
    va, vb = a_.var(ddof=1) / len(a_), b_.var(ddof=1) / len(b_)
    se = np.sqrt(va + vb)
    if se == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va**2 / (len(a_) - 1) + vb**2 / (len(b_) - 1))
    h = stats.t.ppf(0.975, df) * se
    return d, d - h, d + h


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--authors-code", required=True, type=Path)
    p.add_argument("--methods", nargs="+", default=["fedavg", "fpl"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--local-epochs", type=int, default=5)
    p.add_argument("--fraction", type=float, default=0.2)
    p.add_argument("--nf", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.01, help="local lr (theirs: 0.01)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--last", type=int, default=3, help="rounds averaged in the last column")
    p.add_argument("--work", type=Path, default=None)
    p.add_argument(
        "--json", type=Path, default=None, help="every curve (kept: a rerun adds only new runs)"
    )
    a = p.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="rethinkfl_side_"))
    data = work / "data"
    if not data.exists():
        data.mkdir(parents=True)
        print("files:", write_files(data), flush=True)
    # --json FILE that exists: its curves are kept and those runs not repeated (add seeds)
    curves: dict = json.loads(a.json.read_text()) if a.json and a.json.exists() else {}
    for method in a.methods:
        for seed in a.seeds:
            for side in ("ours", "theirs"):
                if f"{side}/{method}/{seed}" in curves:
                    continue
                t0 = time.time()
                if side == "ours":
                    acc = run_ours(data, method, seed, a, work)
                else:
                    acc = run_theirs(a.authors_code.resolve(), data, method, seed, a)
                curves[f"{side}/{method}/{seed}"] = acc
                print(
                    f"{side:6s} {method:6s} seed {seed}: last {acc[-1]:.2f}  "
                    f"curve {[round(v, 1) for v in acc]}  ({time.time() - t0:.0f} s)",
                    flush=True,
                )
                if a.json:
                    a.json.write_text(json.dumps(curves, indent=1))
    print("\n| method | metric | ours | theirs | difference [Welch 95 %] |\n|---|---|---|---|---|")
    for method in a.methods:
        for metric, f in (
            ("last round", lambda c: c[-1]),
            (f"mean last {a.last}", lambda c: float(np.mean(c[-a.last :]))),
        ):
            o = [f(curves[f"ours/{method}/{s}"]) for s in a.seeds]
            t = [f(curves[f"theirs/{method}/{s}"]) for s in a.seeds]
            d, lo, hi = welch(o, t)
            sd = lambda v: np.std(v, ddof=1) if len(v) > 1 else 0.0  # noqa: E731
            print(
                f"| {method} | {metric} | {np.mean(o):.2f} ± {sd(o):.2f} | "
                f"{np.mean(t):.2f} ± {sd(t):.2f} | {d:+.2f} [{lo:+.2f}, {hi:+.2f}] |"
            )
    print(f"\nseeds {a.seeds}; chance 10 %; work dir {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
