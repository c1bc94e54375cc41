"""Inputs that used to pass the checks and go wrong only after start-up: a wrong key or
type inside a nested section names the full key; values that overflow or never end are
bounded up front; per-client evaluation on clients too small for a test share says so.
All through the CLI's ``main`` in process: exit 2 and one line naming the key and the
file, before any Flower process exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch  # noqa: F401 - imported before no_flower replaces subprocess.Popen
import yaml

from fedrcl_flwr import client_eval, runner
from fedrcl_flwr.cli import main

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"

TINY = {
    "name": "tiny",
    "dataset": {
        "name": "synthetic",
        "synthetic": {"num_train": 200, "num_test": 40, "num_classes": 4, "image_size": 8},
    },
    "partition": {"scheme": "iid"},
    "model": {"name": "cnn5"},
    "federation": {"num_clients": 4, "rounds": 1, "participation": None, "clients_per_round": 2},
    "client": {"local_epochs": 1, "batch_size": 16, "device": "cpu"},
}


@pytest.fixture
def no_flower(monkeypatch):
    """Fail the test if the CLI gets as far as starting Flower."""
    import subprocess

    def boom(*a, **k):
        raise AssertionError("a Flower process was about to start")

    monkeypatch.setattr(runner, "run_simulation_via_flower", boom)
    monkeypatch.setattr(subprocess, "Popen", boom)


def _exit2(capsys, tmp_path, *sets, experiment=None):
    exp = experiment or str(QUICKSTART)
    args = ["run", exp, "--out", str(tmp_path / "out")]
    for s in sets:
        args += ["--set", s]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert exp in err, err
    assert not (tmp_path / "out").exists()
    return err


@pytest.mark.parametrize(
    "value, words",
    [
        ("privacy.dp={epsilonn: 3}", ["unknown key 'privacy.dp.epsilonn'", "noise_multiplier"]),
        (
            "privacy.dp={noise_multiplier: '1.0', clipping_norm: 1}",
            ["'privacy.dp.noise_multiplier' must be float or null, got str"],
        ),
        (
            "evaluation.per_client={every: 1, finetune_step: 3}",
            ["'evaluation.per_client.finetune_step'", "'evaluation.per_client.finetune_steps'?"],
        ),
        (
            "federation.availability.stragglers={speeed: 1}",
            ["'federation.availability.stragglers.speeed'", "did you mean", ".speed'?"],
        ),
        ("dataset.synthetic={num_trian: 10}", ["'dataset.synthetic.num_trian'", "num_train'?"]),
        ("dataset.normalize={meen: [0.5], std: [0.5]}", ["'dataset.normalize.meen'", "mean"]),
    ],
)
def test_nested_keys_are_named_in_full(tmp_path, capsys, no_flower, value, words):
    err = _exit2(capsys, tmp_path, value)
    assert all(w in err for w in words), err
    assert "must be DPConfig" not in err


@pytest.mark.parametrize(
    "value, key",
    [
        ("client.local_epochs=10001", "client.local_epochs"),
        ("client.iterations_per_epoch=1000001", "client.iterations_per_epoch"),
        ("evaluation.per_client.finetune_steps=1000000000", "evaluation.per_client.finetune_steps"),
        ("evaluation.robust_steps=10001", "evaluation.robust_steps"),
        ("dataset.normalize={mean: [0.5, 0.5, 0.5], std: [1e-300, 1, 1]}", "dataset.normalize.std"),
        (
            "privacy.dp={noise_multiplier: 1e200, clipping_norm: 1e200}",
            "privacy.dp.noise_multiplier' x 'privacy.dp.clipping_norm",
        ),
        (
            "privacy.dp={noise_multiplier: 1e16, clipping_norm: 1e15}",
            "privacy.dp.noise_multiplier' x 'privacy.dp.clipping_norm",
        ),
    ],
)
def test_values_that_never_end_or_overflow_are_bounded(tmp_path, capsys, no_flower, value, key):
    err = _exit2(capsys, tmp_path, value)
    assert f"'{key}'" in err, err


@pytest.mark.parametrize(
    "sets, words",
    [
        (["privacy.secagg_clipping_range=1e-300"], ["below the initial model's largest"]),
        (
            ["privacy.secagg_clipping_range=100", "privacy.secagg_quantization_range=1000"],
            ["quantisation step of 0.2"],
        ),
    ],
)
def test_secagg_range_must_hold_the_model(tmp_path, capsys, no_flower, sets, words):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(TINY))
    err = _exit2(capsys, tmp_path, "privacy.secagg=true", *sets, experiment=str(p))
    assert "'privacy.secagg_clipping_range'" in err and all(w in err for w in words), err


def test_secagg_default_range_is_accepted(tmp_path, capsys, monkeypatch):
    """The default range (8, 2^22 levels) passes the check: the refusal above is the
    value's. The run itself is not started (the simulation is replaced)."""
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(TINY))
    monkeypatch.setattr(runner, "run_simulation_via_flower", lambda *a, **k: {})
    rc = main(["run", str(p), "--out", str(tmp_path / "o"), "--set", "privacy.secagg=true"])
    assert rc == 0, capsys.readouterr().err


def test_no_client_can_hold_a_test_share_is_exit_2(tmp_path, capsys, no_flower):
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(TINY))  # 4 clients of 50 samples: 0.005 * 50 rounds to 0
    err = _exit2(
        capsys,
        tmp_path,
        "evaluation.per_client={every: 1, local_test_fraction: 0.005}",
        experiment=str(p),
    )
    assert "'evaluation.per_client.local_test_fraction' 0.005 holds out no sample" in err, err


def test_some_clients_without_a_test_share_note_and_count(tmp_path, capsys, monkeypatch):
    """Unbalanced split: the small clients hold no test sample. One note before the run;
    the round record counts them (``client_eval_no_test``) instead of silent nulls."""
    cfg = {**TINY, "partition": {"scheme": "dirichlet", "alpha": 0.1, "balanced": False}}
    cfg["partition"]["min_size"] = 1
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(runner, "run_simulation_via_flower", lambda *a, **k: {})
    from fedrcl_flwr.launch.preflight import load_experiment
    from fedrcl_flwr.run import runtime

    loaded = load_experiment(
        str(p), ["evaluation.per_client={every: 1, local_test_fraction: 0.02}"], None
    )
    parts = runtime.client_partitions(loaded)
    small = client_eval.clients_without_test(loaded, parts)
    assert 0 < len(small) < len(parts), [len(x) for x in parts]
    rc = main(
        [
            "run",
            str(p),
            "--out",
            str(tmp_path / "o"),
            "--set",
            "evaluation.per_client={every: 1, local_test_fraction: 0.02}",
        ]
    )
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "too small for a local test share" in line]
    assert rc == 0 and len(notes) == 1, out
    assert notes[0].startswith(f"fedrcl-flwr: note: {len(small)} of {len(parts)} clients")
    # the round record: the clients without test data are counted, the rest summarised
    results = {0: (3, 4, 1.0), 1: (0, 0, 0.0), 2: (1, 2, 0.5)}
    rec = client_eval.summarize(results)
    assert rec["client_eval_no_test"] == 1 and rec["client_acc_n"] == 2
    assert rec["client_acc_mean"] == pytest.approx((0.75 + 0.5) / 2)
    assert "client_eval_no_test" not in client_eval.summarize({0: (3, 4, 1.0)})
