"""Planning a sweep is linear with a small constant (3,000 variants in seconds, issue
figures in docs/cli.md): each run's experiment is flattened and hashed once, the
schema's defaults once per process. Names and plan text are byte-identical to what the
planner printed before it was made fast (captured from commit e67de5a)."""

from __future__ import annotations

import re

import yaml

from fedrcl_flwr.cli import main
from fedrcl_flwr.launch import sweep_spec

BASE = {
    "name": "s",
    "dataset": {"name": "synthetic", "synthetic": {"num_train": 2000, "num_test": 100}},
    "federation": {"num_clients": 20, "rounds": 2, "participation": None, "clients_per_round": 2},
    "client": {"device": "cpu"},
}
SPEC = {
    "base": "base.yaml",
    "grid": {"client.method": ["fedavg", "fedprox"], "partition.alpha": [0.1, 0.3]},
    "seeds": [0, 1],
    "variants": [
        {"label": "lr-a", "client.lr": 0.05},
        {"label": "b", "client.lr": 0.1, "client.betas": [0.8, 0.99], "client.momentum": 0.0},
    ],
    "set": {"evaluation.target_rounds": [1, 2], "model.params": {}},
}

# `fedrcl-flwr sweep SWEEP --out OUT --dry-run` at e67de5a (before the planner was made
# linear), OUT replaced by the placeholder
BEFORE = (
    "16 runs -> OUT\n"
    "every run: evaluation.target_rounds=[1, 2], model.params={}\n"
    "   1. lr-a_seed=0_98602e9d  [new]  base.yaml: client.lr=0.05, client.method=fedavg, partition.alpha=0.1, seed=0\n"
    "   2. lr-a_seed=1_3773d5c9  [new]  base.yaml: client.lr=0.05, client.method=fedavg, partition.alpha=0.1, seed=1\n"
    "   3. lr-a_seed=0_d66e6be6  [new]  base.yaml: client.lr=0.05, client.method=fedavg, partition.alpha=0.3, seed=0\n"
    "   4. lr-a_seed=1_ab0ef770  [new]  base.yaml: client.lr=0.05, client.method=fedavg, partition.alpha=0.3, seed=1\n"
    "   5. lr-a_seed=0_b1c63195  [new]  base.yaml: client.lr=0.05, client.method=fedprox, partition.alpha=0.1, seed=0\n"
    "   6. lr-a_seed=1_a4e1535d  [new]  base.yaml: client.lr=0.05, client.method=fedprox, partition.alpha=0.1, seed=1\n"
    "   7. lr-a_seed=0_393ff77f  [new]  base.yaml: client.lr=0.05, client.method=fedprox, partition.alpha=0.3, seed=0\n"
    "   8. lr-a_seed=1_d139ea80  [new]  base.yaml: client.lr=0.05, client.method=fedprox, partition.alpha=0.3, seed=1\n"
    "   9. b_seed=0_1bfac5e0  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedavg, partition.alpha=0.1, seed=0\n"
    "  10. b_seed=1_d04d9478  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedavg, partition.alpha=0.1, seed=1\n"
    "  11. b_seed=0_4924085d  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedavg, partition.alpha=0.3, seed=0\n"
    "  12. b_seed=1_2909f54d  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedavg, partition.alpha=0.3, seed=1\n"
    "  13. b_seed=0_dd10d32b  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedprox, partition.alpha=0.1, seed=0\n"
    "  14. b_seed=1_ff27a349  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedprox, partition.alpha=0.1, seed=1\n"
    "  15. b_seed=0_a4696b19  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedprox, partition.alpha=0.3, seed=0\n"
    "  16. b_seed=1_47f6cf4b  [new]  base.yaml: client.betas=[0.8, 0.99], client.lr=0.1, client.momentum=0.0, client.method=fedprox, partition.alpha=0.3, seed=1\n"
)


def _plan_text(tmp_path, capsys) -> str:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    sw = tmp_path / "sweep.yaml"
    sw.write_text(yaml.safe_dump(SPEC))
    assert main(["sweep", str(sw), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    return capsys.readouterr().out.replace(str(tmp_path / "out"), "OUT")


def test_plan_text_and_names_are_unchanged(tmp_path, capsys):
    """Byte-identical but for the grid values the names now show (the grid keys
    with more than one value, ``lr-a_method=fedavg_alpha=0.1_seed=0_<hash>``): the same
    hashes, the same plan text."""
    text = _plan_text(tmp_path, capsys)
    assert "lr-a_method=fedavg_alpha=0.1_seed=0_98602e9d" in text
    assert re.sub(r"_method=[a-z]+_alpha=[0-9.]+_seed=", "_seed=", text) == BEFORE


def test_each_run_is_hashed_once(tmp_path, monkeypatch):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    sw = tmp_path / "sweep.yaml"
    sw.write_text(yaml.safe_dump(SPEC))
    calls = []
    real = sweep_spec.experiment_hash
    monkeypatch.setattr(sweep_spec, "experiment_hash", lambda cfg: calls.append(1) or real(cfg))
    runs, _ = sweep_spec.plan_sweep(sw, tmp_path / "out")
    assert len(runs) == 16 and len(calls) == 16
    assert all(r.name.endswith("_" + real(r.cfg)) for r in runs)
