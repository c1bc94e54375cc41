"""Regenerate the FedRCL reference subset in this folder (run by hand, never by tests).

Source: the reference vectors produced by the authors' code (skynbe/FedRCL @ 378beb4), see
README.md here. Usage: ``python tests/data/fedrcl/make_subset.py /path/to/refs/fedrcl``.

* ``model_forward_step_seed1234.npz`` is copied unchanged; ``param_order.json`` is the
  reference's state_dict order (names, shapes) from its README.json.
* ``rcl_case_seed{k}.npz`` keeps, per seed, the labels, every ``*_f64`` loss value and
  per-anchor array, every ``*_gradnorm_*`` value, plus ``pooled64_layer{l}`` = the spatial
  mean of the stored float32 ``layer{l}`` tensor computed in float64 (what the
  reference's float64 run fed to its loss). Seed 0 additionally keeps the raw 4-D
  ``layer{l}`` inputs and the full ``S1_default__grad_layer{l}_f32`` gradients.
  Dropped: cosine matrices, float32 per-anchor values, ``layer5`` (unused logits) and the
  4-D tensors of seeds 1-4 (keeps the copy ~1.5 MB).
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np


def main(src: str) -> None:
    src_dir = Path(src)
    out = Path(__file__).resolve().parent
    shutil.copyfile(
        src_dir / "model_forward_step_seed1234.npz", out / "model_forward_step_seed1234.npz"
    )
    meta = json.loads((src_dir / "README.json").read_text())
    order = meta["model_forward_step_seed1234.npz"]["param_order"]
    (out / "param_order.json").write_text(json.dumps(order) + "\n")
    for seed in range(5):
        d = np.load(src_dir / f"rcl_case_seed{seed}.npz")
        keep = {"labels": d["labels"]}
        for lvl in range(5):
            x = d[f"layer{lvl}"].astype(np.float64)
            keep[f"pooled64_layer{lvl}"] = x.mean(axis=(2, 3))
            keep[f"layer{lvl}_hw"] = np.int64(x.shape[2] * x.shape[3])
            if seed == 0:
                keep[f"layer{lvl}"] = d[f"layer{lvl}"]
                keep[f"S1_default__grad_layer{lvl}_f32"] = d[f"S1_default__grad_layer{lvl}_f32"]
        for k in d.files:
            if k.endswith("_f64") and not k.startswith("cos_"):
                keep[k] = d[k]
            elif "__gradnorm_" in k:
                keep[k] = d[k]
        np.savez(out / f"rcl_case_seed{seed}.npz", **keep)


if __name__ == "__main__":
    main(sys.argv[1])
