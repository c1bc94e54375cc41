"""End-to-end federated runs driven in process (real strategy + real clients, no Flower
runtime): learning, determinism, every method x every server optimizer, faults, resume."""

import json
import math

import numpy as np
import pytest

from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.run.results import read_metrics


def _strip(recs):
    return [{k: v for k, v in r.items() if k not in ("wall_time_s", "round_time_s")} for r in recs]


def test_fedavg_learns_above_chance(tiny, tmp_path):
    cfg = tiny(
        federation={"rounds": 8, "clients_per_round": 4}, client={"local_epochs": 2, "lr": 0.1}
    )
    run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == list(range(1, 9))
    assert recs[-1]["test_accuracy"] > 0.4  # 4 classes: chance 0.25
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["rounds"] == 8 and set(s["accuracy_at"]) == {"2"}
    assert (tmp_path / "run" / "accuracy.png").exists()
    assert (tmp_path / "run" / "model.pt").exists()


def test_same_yaml_same_metrics(tiny, tmp_path):
    cfg = tiny(client={"method": "fedrcl"})
    run_inprocess(cfg, tmp_path / "a")
    run_inprocess(cfg, tmp_path / "b")
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert _strip(a) == _strip(b)


@pytest.mark.parametrize("method", ["fedavg", "fedrcl"])
@pytest.mark.parametrize("strategy", ["fedavg", "fedavgm", "fedadam", "fedacg"])
def test_method_x_server_optimizer_grid(tiny, tmp_path, method, strategy):
    cfg = tiny(client={"method": method}, server={"strategy": strategy}, federation={"rounds": 2})
    st = run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert len(recs) == 2
    assert all(math.isfinite(r["test_loss"]) and math.isfinite(r["train_loss"]) for r in recs)
    assert all(np.all(np.isfinite(w)) for w in st.weights if w.dtype.kind == "f")
    if method == "fedrcl":
        assert "train_loss_rcl" in recs[0]
    if strategy == "fedacg":
        assert "train_loss_acg" in recs[0]


@pytest.mark.parametrize("mode", ["raise", "nan", "inf", "shape", "missing"])
def test_faulty_clients_are_dropped_and_counted(tiny, tmp_path, mode):
    cfg = tiny(
        client={"method": "faulty", "params": {"mode": mode, "partitions": [-1]}},
        federation={
            "rounds": 3,
            "clients_per_round": 3,
            "num_clients": 8,
            "max_consecutive_failed_rounds": 5,
        },
    )
    # only some partitions fail: those sampled in round 1 except the first
    from fedrcl_flwr.run.runtime import sample_partitions

    bad = sample_partitions(cfg.seed, 1, 8, 3)[1:]
    cfg.client.params["partitions"] = bad
    st = run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert recs[0]["failures"] == 2 and recs[0]["num_clients"] == 1
    assert all(np.all(np.isfinite(w)) for w in st.weights if w.dtype.kind == "f")
    assert all(math.isfinite(r["test_loss"]) for r in recs)


def test_all_failed_round_keeps_model_then_aborts(tiny, tmp_path):
    from strategies.round_records import AllClientsFailed

    cfg = tiny(
        client={"method": "faulty", "params": {"mode": "raise"}},
        federation={"rounds": 4, "max_consecutive_failed_rounds": 2},
    )
    with pytest.raises(AllClientsFailed, match="consecutive"):
        run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert len(recs) == 1 and recs[0]["num_clients"] == 0 and recs[0]["failures"] == 2


@pytest.mark.parametrize("strategy", ["fedavgm", "fedadam"])
def test_resume_equals_uninterrupted(tiny, tmp_path, strategy):
    cfg = tiny(
        server={"strategy": strategy},
        federation={"rounds": 4},
        output={"checkpoint_every": 1},
        client={"method": "fedrcl"},
    )
    run_inprocess(cfg, tmp_path / "full")
    run_inprocess(cfg, tmp_path / "cut", stop_after=2)
    assert len(read_metrics(tmp_path / "cut")) == 2
    run_inprocess(cfg, tmp_path / "cut", resume=True)
    assert _strip(read_metrics(tmp_path / "full")) == _strip(read_metrics(tmp_path / "cut"))


def test_resume_extends_finished_run(tiny, tmp_path):
    cfg = tiny(federation={"rounds": 2}, output={"checkpoint_every": 1})
    run_inprocess(cfg, tmp_path / "run")
    longer = tiny(federation={"rounds": 3}, output={"checkpoint_every": 1})
    run_inprocess(longer, tmp_path / "run", resume=True)
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3]


@pytest.mark.parametrize("strategy", ["fedavgm", "feddyn"])
def test_overlapped_evaluation_equals_sequential(tiny, tmp_path, strategy):
    """The ServerApp evaluates and checkpoints round r in a background thread while
    round r+1 trains: records, checkpoints, model and summary are those of the sequential
    order, also when a resumed run continues one cut short."""
    import torch

    from fedrcl_flwr.run.checkpoint import load_checkpoint

    method = "feddyn" if strategy == "feddyn" else "fedrcl"
    cfg = tiny(
        server={"strategy": strategy},
        federation={"rounds": 4, "eval_every": 2},
        output={"checkpoint_every": 1},
        client={"method": method},
    )
    run_inprocess(cfg, tmp_path / "seq")
    run_inprocess(cfg, tmp_path / "ovl", overlap_evaluation=True)
    run_inprocess(cfg, tmp_path / "cut", overlap_evaluation=True, stop_after=3)
    assert load_checkpoint(tmp_path / "cut")["round"] == 3  # drained before returning
    run_inprocess(cfg, tmp_path / "cut", resume=True, overlap_evaluation=True)
    seq = _strip(read_metrics(tmp_path / "seq"))
    assert [r["round"] for r in seq] == [2, 4]
    for other in ("ovl", "cut"):
        assert _strip(read_metrics(tmp_path / other)) == seq
        a = load_checkpoint(tmp_path / "seq")["strategy"]
        b = load_checkpoint(tmp_path / other)["strategy"]
        assert all(np.array_equal(x, y) for x, y in zip(a["weights"], b["weights"]))
        ma = torch.load(tmp_path / "seq" / "model.pt")
        mb = torch.load(tmp_path / other / "model.pt")
        assert all(torch.equal(ma[k], mb[k]) for k in ma)
        sa = json.loads((tmp_path / "seq" / "summary.json").read_text())
        sb = json.loads((tmp_path / other / "summary.json").read_text())
        assert {k: v for k, v in sa.items() if "time" not in k} == {
            k: v for k, v in sb.items() if "time" not in k
        }


def test_overlapped_evaluation_error_reaches_the_server_loop(tiny, tmp_path):
    """An exception in the background round end is raised by the next ``evaluate`` (the
    run fails), never lost."""
    from fedrcl_flwr.app.server_app import build_server

    cfg = tiny(federation={"rounds": 3})
    strategy, _ = build_server(cfg, tmp_path / "run", overlap_evaluation=True)
    calls = []

    def broken(rnd, weights):
        calls.append(rnd)
        raise RuntimeError("evaluation exploded")

    strategy.evaluate_fn = broken
    strategy._fit_info = {}
    assert strategy.evaluate(1, None) is None  # handed to the thread
    with pytest.raises(RuntimeError, match="evaluation exploded"):
        strategy.evaluate(2, None)
    assert calls == [1]


class _JumpingClock:
    """``time.time`` for the strategy: the real clock plus the seconds each evaluation
    "took" (a jump of 1,000 s per evaluation: a count, not a measured time)."""

    def __init__(self):
        import time as real

        self.real, self.offset = real, 0.0

    def time(self):
        return self.real.time() + self.offset

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("overlap", [False, True])
def test_round_time_leaves_out_an_evaluation_that_overlaps_the_next_round(
    tiny, tmp_path, monkeypatch, overlap
):
    """Each evaluation advances the strategy's clock by 1,000 s. Sequential: every round's
    ``round_time_s`` includes its evaluation. Overlapped: a round's time ends when its
    evaluation is handed to the background thread, so an evaluation counts in the round
    it overlaps, once: the rounds' times add up to the run's."""
    import strategies.base as base
    import strategies.round_end as round_end
    from fedrcl_flwr.app.server_app import build_server

    clock = _JumpingClock()
    monkeypatch.setattr(base, "time", clock)  # the round's start
    monkeypatch.setattr(round_end, "time", clock)  # its end and the hand-over
    cfg = tiny(federation={"rounds": 3})
    build = build_server

    def jumping(build_fn):
        def wrapped(*a, **k):
            strategy, rest = build_fn(*a, **k)
            inner = strategy.evaluate_fn

            def evaluate_fn(rnd, weights):
                out = inner(rnd, weights)
                clock.offset += 1000.0
                return out

            strategy.evaluate_fn = evaluate_fn
            return strategy, rest

        return wrapped

    import fedrcl_flwr.app.inprocess as inprocess

    monkeypatch.setattr(inprocess, "build_server", jumping(build), raising=False)
    run_inprocess(cfg, tmp_path / "run", overlap_evaluation=overlap)
    times = [r["round_time_s"] for r in read_metrics(tmp_path / "run")]
    assert len(times) == 3
    jumps = [int(t // 1000.0) for t in times]  # the real seconds of a round are < 1,000
    # overlapped: evaluation t runs during round t + 1 (which waits for it before its own
    # hand-over), the last round's evaluation in line; the sum is the run's 3 evaluations,
    # never one counted twice
    assert jumps == ([0, 1, 2] if overlap else [1, 1, 1]), times
