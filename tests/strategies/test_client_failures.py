"""No silent systematic client failure: every client whose update did not reach the model
is counted per partition (``summary.json``'s ``client_failures``: rounds failed, rounds
asked to train, first error), and a client that failed in every round it was sampled is
named on the ``done`` line. Flower's "no reply" of a timed-out client is said in the
run's words."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import TINY, FakeManager, fit_result, make_strategy

from fedrcl_flwr.config import config_from_dict


def _always_raising_run(tmp_path):
    """Four clients, all sampled, two rounds; partition 1 raises in every round."""
    from fedrcl_flwr.app.inprocess import run_inprocess

    cfg = config_from_dict(
        dict(
            TINY,
            client=dict(
                TINY["client"], method="faulty", params={"mode": "raise", "partitions": [1]}
            ),
            federation=dict(TINY["federation"], clients_per_round=4),
            output={"dir": str(tmp_path / "run"), "checkpoint_every": 1},
        )
    )
    run_inprocess(cfg, tmp_path / "run")
    return cfg, json.loads((tmp_path / "run" / "summary.json").read_text())


@pytest.mark.integration
def test_a_client_that_always_raises_is_named_in_summary_and_done_line(tmp_path):
    from fedrcl_flwr.cli import _result_text
    from fedrcl_flwr.run.results import read_metrics

    cfg, summary = _always_raising_run(tmp_path)
    assert [r["failures"] for r in read_metrics(tmp_path / "run")] == [1, 1]
    assert summary["client_failures"] == {
        "1": {"failed": 2, "rounds": 2, "first_error": "injected failure on partition 1"}
    }
    line = _result_text(cfg, summary)
    assert "; client 1 failed in 2 of 2 rounds it was sampled: injected failure on partition 1" in (
        line
    )
    assert line.endswith("(summary.json: client_failures)")


@pytest.mark.integration
def test_the_counts_survive_a_resume(tmp_path):
    """The counts are part of the strategy's checkpointed state: a run stopped after
    round 1 and resumed counts both rounds."""
    from fedrcl_flwr.app.inprocess import run_inprocess

    cfg = config_from_dict(
        dict(
            TINY,
            client=dict(
                TINY["client"], method="faulty", params={"mode": "raise", "partitions": [1]}
            ),
            federation=dict(TINY["federation"], clients_per_round=4),
            output={"dir": str(tmp_path / "run"), "checkpoint_every": 1},
        )
    )
    run_inprocess(cfg, tmp_path / "run", stop_after=1)
    assert not (tmp_path / "run" / "summary.json").exists()
    run_inprocess(cfg, tmp_path / "run", resume=True)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["client_failures"]["1"]["failed"] == 2
    assert summary["client_failures"]["1"]["rounds"] == 2


def _round(strategy, rnd, results, failures):
    strategy.configure_fit(rnd, None, FakeManager(10))
    strategy.aggregate_fit(rnd, results, failures)


def _tagged(pid, line):
    """A ClientApp's error as Flower hands it to the strategy (``name_errors`` mod)."""
    from flwr.app import Error

    from fedrcl_flwr.protocol import tag_partition

    reason = (
        "<class 'flwr.clientapp.ClientAppException'>:<'\\nException ClientAppException "
        f"occurred. Message: {tag_partition(pid, line)}'>"
    )
    return Exception(Error(0, reason))


def _proxied(pid, line):
    """A ClientApp's error as Flower's legacy client proxy raises it (a simulation under
    ``flwr run``): ``vce_api.py``'s reason of the ``ClientAppException`` inside
    ``grid_client_proxy.py``'s ``ValueError`` (flwr 1.42)."""
    from flwr.clientapp.client_app import ClientAppException

    from fedrcl_flwr.protocol import tag_partition

    ex = ClientAppException(tag_partition(pid, line))
    reason = str(type(ex)) + ":<'" + str(ex) + "'>"
    return ValueError(
        f"Message contains an Error (reason: {reason}). "
        "It originated during client-side execution of a message."
    )


def test_counts_per_partition_over_rounds():
    """A client failing in some rounds is counted, not named; one failing in every round
    it was sampled is named; an unusable result counts like an error."""
    from fedrcl_flwr.run.runtime import sample_partitions
    from fedrcl_flwr.run.summaries import always_failing
    from strategies.round_records import failure_counts

    w = [np.zeros(3, np.float32)]
    s = make_strategy(w, num_clients=10, clients_per_round=3, rounds=3)
    seen: dict[int, int] = {}
    for rnd in (1, 2, 3):
        pids = sample_partitions(0, rnd, 10, 3)
        for p in pids:
            seen[p] = seen.get(p, 0) + 1
        a, b, c = pids
        results = [fit_result([np.ones(3, np.float32)], pid=a)]
        nan = [np.full(3, np.nan, np.float32)]
        results.append(fit_result(nan, pid=b))  # unusable: counted for b
        failures = [_tagged(c, f"ValueError: bad {rnd}")]
        _round(s, rnd, results, failures)
    counts = failure_counts(s.state_dict())
    failed: dict[int, int] = {}
    for rnd in (1, 2, 3):
        for p in sample_partitions(0, rnd, 10, 3)[1:]:
            failed[p] = failed.get(p, 0) + 1
    assert {int(k): v["failed"] for k, v in counts.items()} == failed
    assert {int(k): v["rounds"] for k, v in counts.items()} == {p: seen[p] for p in failed}
    b1, c1 = sample_partitions(0, 1, 10, 3)[1:]
    assert counts[str(c1)]["first_error"] == "ValueError: bad 1"
    assert counts[str(b1)]["first_error"] == "array 0 contains NaN or Inf"
    named = always_failing({"client_failures": counts})
    expected = sorted(p for p in failed if failed[p] == seen[p])
    assert [int(n.split()[1]) for n in named] == expected
    # the counts travel with the checkpointed state
    t = make_strategy(w, num_clients=10, clients_per_round=3, rounds=3)
    t.load_state_dict(s.state_dict())
    assert failure_counts(t.state_dict()) == counts


def test_a_client_without_a_reply_is_the_partition_without_a_result():
    """Flower's timeout gives ``ValueError("Expected one Message but got: 0")``, no
    partition: the sampled partition that sent nothing back failed, in the run's words."""
    from strategies.round_records import failure_counts

    w = [np.zeros(3, np.float32)]
    s = make_strategy(w, num_clients=3, clients_per_round=3, rounds=2, round_timeout_s=30.0)
    s.configure_fit(1, None, FakeManager(3))
    a, b, c = s._sent
    s.aggregate_fit(
        1,
        [fit_result([np.ones(3, np.float32)], pid=a), fit_result([np.ones(3, np.float32)], pid=b)],
        [ValueError("Expected one Message but got: 0")],
    )
    assert failure_counts(s.state_dict()) == {
        str(c): {
            "failed": 1,
            "rounds": 1,
            "first_error": "timed out: no reply within 30 s (federation.round_timeout_s)",
        }
    }


def test_every_client_timed_out_is_said_in_the_runs_words():
    from strategies.round_records import failure_counts

    w = [np.zeros(3, np.float32)]
    s = make_strategy(
        w, num_clients=2, clients_per_round=2, rounds=2, round_timeout_s=2.5,
        max_consecutive_failed_rounds=5,
    )  # fmt: skip
    s.configure_fit(1, None, FakeManager(2))
    s.aggregate_fit(1, [], [ValueError("Expected one Message but got: 0")] * 2)
    reason = s._failure_reason()
    assert reason == "every client timed out: no reply within 2.5 s (federation.round_timeout_s)"
    assert "Expected one Message" not in reason
    counts = failure_counts(s.state_dict())
    assert set(counts) == {"0", "1"}  # both named, though the errors carry no partition
    assert {v["first_error"] for v in counts.values()} == {
        "timed out: no reply within 2.5 s (federation.round_timeout_s)"
    }


@pytest.mark.parametrize(
    "make, pid, line",
    [
        (lambda: _tagged(17, "RuntimeError: boom"), 17, "RuntimeError: boom"),
        (lambda: _proxied(3, "ValueError: x 'y'"), 3, "ValueError: x 'y'"),
        (lambda: ValueError("Expected one Message but got: 0"), None, "no reply from the client"),
        (lambda: RuntimeError("plain"), None, "plain"),
    ],
)
def test_client_failure_reads_the_partition(make, pid, line):
    from strategies.screening import client_error_line, client_failure

    assert client_failure(make()) == (pid, line)
    assert client_error_line(make()) == line  # the round's error line: without the tag


def test_name_errors_tags_the_partition():
    """The ClientApp's mod puts the partition of the failed round in front of the line
    (``clients/base.py`` sets the exception's ``partition_id``)."""
    from fedrcl_flwr.app.client_app import name_errors
    from fedrcl_flwr.protocol import untag_partition

    def boom(message, context):
        exc = KeyError("x")
        exc.partition_id = 5
        raise exc

    with pytest.raises(RuntimeError) as ei:
        name_errors(None, None, boom)
    assert untag_partition(str(ei.value)) == (5, "KeyError: 'x'")


def test_the_client_names_its_partition_when_it_raises(tmp_path):
    """In process the raised exception carries ``partition_id``."""
    from flwr.common import FitIns, ndarrays_to_parameters

    from clients import client_class
    from fedrcl_flwr.protocol import FitInstructions
    from fedrcl_flwr.run import runtime

    cfg = config_from_dict(
        dict(
            TINY,
            client=dict(TINY["client"], method="faulty", params={"mode": "raise"}),
            output={"dir": str(tmp_path / "run")},
        )
    )
    client = client_class("faulty")(cfg, state_dir=str(tmp_path / "state"))
    model = runtime.new_model(cfg, runtime.load_bundle(cfg))
    params = ndarrays_to_parameters(runtime.get_weights(model))
    with pytest.raises(RuntimeError) as ei:
        client.to_client().fit(FitIns(params, FitInstructions.build(1, 3).to_config()))
    assert ei.value.partition_id == 3


def test_the_done_line_names_three_and_counts_the_others(tmp_path):
    """Three clients that failed in every round they were sampled are named (partition
    order), the others counted; one that failed in some rounds only is not named."""
    from helpers import tiny_config

    from fedrcl_flwr.cli import _result_text

    # as failure_counts writes them: partition ids in numeric order
    entries = {str(p): {"failed": 2, "rounds": 2, "first_error": f"E{p}"} for p in (3, 5, 9, 11)}
    entries["4"] = {"failed": 1, "rounds": 3, "first_error": "sometimes"}
    entries["12"] = {"failed": 2, "rounds": 2, "first_error": "E12"}
    order = sorted(entries, key=int)
    summary = {"final_accuracy": 0.5, "client_failures": {k: entries[k] for k in order}}
    line = _result_text(tiny_config(tmp_path), summary)
    named = [p.split()[1] for p in line.split("; ")[1:4]]
    assert named == ["3", "5", "9"], line
    assert "; client 3 failed in 2 of 2 rounds it was sampled: E3;" in line
    assert "; 2 more clients failed in every round they were sampled" in line
    assert "client 4" not in line and line.startswith("final accuracy 50.00%; client ")
    assert line.endswith("(summary.json: client_failures)")
