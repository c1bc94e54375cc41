"""TensorBoard event files (output.tensorboard), read back with tensorboard's own event
reader: the same numbers as metrics.jsonl, per-domain and representation tags, the config
as text, purged and rewritten rounds after a resume; missing extra = exit 2."""

import importlib.util
import math
from pathlib import Path

import pytest
from helpers import TINY_SYNTHETIC

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.cli import main
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.tracking.records import scalars
from fedrcl_flwr.tracking.tensorboard_backend import TB_DIR

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402 - after importorskip
    EventAccumulator,
)


def _events(run_dir):
    acc = EventAccumulator(str(run_dir / TB_DIR), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _check_same_as_metrics(acc, recs):
    tags = set(acc.Tags()["scalars"])
    for rec in recs:
        for tag, value in scalars(rec).items():
            assert tag in tags, tag
            by_step = {e.step: e.value for e in acc.Scalars(tag)}
            assert by_step[rec["round"]] == pytest.approx(value, rel=1e-6), (tag, rec["round"])


def test_events_carry_the_metrics_records(tiny, tmp_path):
    cfg = tiny(
        client={"method": "fedrcl"},
        federation={"rounds": 3},
        dataset={
            "name": "synthetic",
            "synthetic": {**TINY_SYNTHETIC, "num_domains": 2},
        },
        evaluation={"target_rounds": [2], "representation_every": 1},
        output={"dir": str(tmp_path / "run"), "tensorboard": True},
    )
    run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    acc = _events(tmp_path / "run")
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "accuracy/test",
        "accuracy/ema",
        "loss/test",
        "train/train_loss",
        "train/train_loss_rcl",
        "representation/effective_rank",
        "comm/model_bytes_up",
        "round/num_clients",
    ):
        assert tag in tags, (tag, sorted(tags))
    assert any(t.startswith("domain_accuracy/") for t in tags), sorted(tags)
    assert [e.step for e in acc.Scalars("accuracy/test")] == [1, 2, 3]
    _check_same_as_metrics(acc, recs)
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "method: fedrcl" in text and "tensorboard: true" in text


def test_resumed_run_has_each_round_once(tiny, tmp_path):
    cfg = tiny(
        federation={"rounds": 4},
        output={"dir": str(tmp_path / "run"), "tensorboard": True, "checkpoint_every": 2},
    )
    run_inprocess(cfg, tmp_path / "run", stop_after=3)  # round 3 logged, checkpoint at 2
    assert [e.step for e in _events(tmp_path / "run").Scalars("accuracy/test")] == [1, 2, 3]
    run_inprocess(cfg, tmp_path / "run", resume=True)
    acc = _events(tmp_path / "run")
    assert [e.step for e in acc.Scalars("accuracy/test")] == [1, 2, 3, 4]
    _check_same_as_metrics(acc, read_metrics(tmp_path / "run"))


def test_scalars_skip_non_numbers():
    got = scalars(
        {
            "round": 2,
            "test_accuracy": 0.5,
            "test_loss": float("nan"),
            "failures": 0,
            "note": "x",
            "ok": True,
            "domain_accuracy": {"a": 0.25},
        }
    )
    assert got == {"accuracy/test": 0.5, "round/failures": 0.0, "domain_accuracy/a": 0.25}
    assert all(math.isfinite(v) for v in got.values())


def test_missing_extra_is_one_line_exit_2(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real(name, *a),
    )
    quickstart = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"
    assert (
        main(
            [
                "run",
                str(quickstart),
                "--set",
                "output.tensorboard=true",
                "--out",
                "/nonexistent/never-created",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "output.tensorboard" in err and "pip install" in err
    assert len(err.strip().splitlines()) == 1
