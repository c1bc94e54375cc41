"""Every run that trains nothing says so. A round in which no client's update
reached the model is recorded as failed with its reason (evaluated or not), a run in which
no round trained fails, SecAgg+ parameters that halt every round are refused before the
run (checked against Flower 1.42's own setup stage), and ``simulation.ray_address: auto``
is refused up front."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from fedrcl_flwr.cli import main
from fedrcl_flwr.privacy import secagg_setup
from fedrcl_flwr.run.progress import format_round_line
from fedrcl_flwr.run.results import read_metrics

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"


# ------------------------------------------------------------ SecAgg+ setup arithmetic


def flower_setup_passes(num_shares, threshold, n: int, monkeypatch) -> bool:
    """Flower's own ``SecAggPlusWorkflow.setup_stage`` for a round with ``n`` sampled
    clients that all answer (a fake grid hands back a public key pair per client):
    whether the stage lets the protocol go on."""
    from flwr.app import ArrayRecord
    from flwr.common import FitIns, Parameters
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
    from flwr.server.workflow.secure_aggregation import secaggplus_workflow as sa

    monkeypatch.setattr(  # a message without a run (Flower's needs one): its destination
        sa,
        "Message",
        lambda content, dst_node_id, **kw: SimpleNamespace(
            metadata=SimpleNamespace(dst_node_id=dst_node_id)
        ),
    )
    wf = SecAggPlusWorkflow(num_shares, threshold)
    proxies = [SimpleNamespace(node_id=100 + i) for i in range(n)]
    context = SimpleNamespace(
        state=SimpleNamespace(
            config_records={MAIN_CONFIGS_RECORD: {WorkflowKey.CURRENT_ROUND: 1}},
            array_records={MAIN_PARAMS_RECORD: ArrayRecord()},
        ),
        strategy=SimpleNamespace(
            configure_fit=lambda *a: [(p, FitIns(Parameters([], ""), {})) for p in proxies]
        ),
        client_manager=SimpleNamespace(num_available=lambda: n),
    )

    class Grid:
        def send_and_receive(self, messages, timeout=None):
            keys = {Key.PUBLIC_KEY_1: b"k1", Key.PUBLIC_KEY_2: b"k2"}
            return [
                SimpleNamespace(
                    has_error=lambda: False,
                    metadata=SimpleNamespace(src_node_id=m.metadata.dst_node_id),
                    content=SimpleNamespace(config_records={RECORD_KEY_CONFIGS: keys}),
                )
                for m in messages
            ]

    return bool(wf.setup_stage(Grid(), context, sa.WorkflowState()))


@pytest.mark.parametrize(
    "shares, threshold, n",
    [
        (1.0, 0.5, 5),  # the defaults
        (100, 0.5, 5),  # shares above the clients as a count: threshold 50 of 5
        (5.0, 0.5, 5),  # a proportion above 1: 25 shares, threshold round(12.5) = 12
        (1.0, 7, 5),  # a threshold count above the clients
        (3, 2, 10),  # few shares: 3 neighbours, threshold 2
        (3, 0.9, 10),  # threshold proportion: max(round(2.7), 2) = 3 of 3 neighbours
        (0.2, 3, 10),  # round(2.0) = 2 shares -> <= 2 -> all 10
        (0.4, 5, 10),  # 4 shares, even -> 5 -> neighbours 5
        (1.0, 1.0, 2),  # two clients, all needed
        (1.0, 0.5, 1),  # one client: Flower halts
        (4, 3, 7),  # 4 shares made odd (5): 5 neighbours
    ],
)
def test_secagg_setup_is_flowers_arithmetic(shares, threshold, n, monkeypatch):
    plan = secagg_setup(shares, threshold, n)
    assert (plan["reason"] is None) == flower_setup_passes(shares, threshold, n, monkeypatch)


@pytest.mark.parametrize(
    "sets, key",
    [
        (["privacy.secagg_num_shares=100"], "privacy.secagg_num_shares"),
        (["privacy.secagg_num_shares=5.0"], "privacy.secagg_num_shares"),
        (["privacy.secagg_threshold=7"], "privacy.secagg_threshold"),
        (  # 3 shares of 5 clients: 3 neighbours each, a threshold of 4 never met
            ["privacy.secagg_num_shares=0.6", "privacy.secagg_threshold=4"],
            "privacy.secagg_threshold",
        ),
    ],
)
def test_secagg_parameters_that_halt_every_round_are_refused(
    sets, key, tmp_path, capsys, monkeypatch
):
    """Before the fix, preflight accepted them and every round ended 'clients 0', exit 0."""
    from fedrcl_flwr import runner

    def no_run(*a, **k):
        raise AssertionError("preflight let the run start")

    monkeypatch.setattr(runner, "run_simulation_via_flower", no_run)
    args = ["run", str(QUICKSTART), "--out", str(tmp_path / "o"), "--set", "privacy.secagg=true"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert key in err and str(QUICKSTART) in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


def test_ray_address_auto_is_refused(tmp_path, capsys, monkeypatch):
    from fedrcl_flwr import runner

    monkeypatch.setattr(runner, "run_simulation_via_flower", None)  # never reached
    args = ["run", str(QUICKSTART), "--out", str(tmp_path / "o")]
    assert main(args + ["--set", "simulation.ray_address=auto"]) == 2
    err = capsys.readouterr().err.strip()
    assert "simulation.ray_address" in err and "explicit" in err and "\n" not in err, err
    assert str(QUICKSTART) in err and not (tmp_path / "o").exists()


# ------------------------------------------------------------ the failed-round rule


@pytest.mark.integration
def test_failed_round_is_recorded_even_when_not_evaluated(tiny, tmp_path):
    """Round 1: both sampled clients drop out (dropout 0.999 for all but one client,
    not sampled in round 1); evaluation only every 2 rounds: round 1 is still recorded,
    failed, with its reason; round 2 trains; summary.json counts the failed round."""
    import json

    from fedrcl_flwr.app.inprocess import run_inprocess
    from fedrcl_flwr.run.runtime import sample_partitions

    r1, r2 = sample_partitions(0, 1, 8, 2), sample_partitions(0, 2, 8, 2)
    keep = next(p for p in r2 if p not in r1)
    dropout = [0.0 if p == keep else 0.999 for p in range(8)]
    cfg = tiny(
        federation={"rounds": 2, "eval_every": 2, "availability": {"dropout": dropout}},
        output={"checkpoint_every": 0},
    )
    run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert [r["round"] for r in recs] == [1, 2]
    assert recs[0]["round_failed"] is True and "test_accuracy" not in recs[0]
    assert recs[0]["failure_reason"] == "all 2 sampled clients dropped out (2)"
    assert "round_failed" not in recs[1] and recs[1]["num_clients"] == 1
    line = format_round_line(recs[0], 2)
    assert "ROUND FAILED (model unchanged): all 2 sampled clients dropped out (2)" in line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_failed"] == 1 and summary["rounds"] == 2


@pytest.mark.integration
def test_run_where_every_round_dropped_fails_with_the_reason(tiny, tmp_path):
    from fedrcl_flwr.app.inprocess import run_inprocess
    from strategies.round_records import AllClientsFailed

    cfg = tiny(federation={"rounds": 2, "availability": {"dropout": 0.999}})
    with pytest.raises(AllClientsFailed) as ei:
        run_inprocess(cfg, tmp_path / "run")
    assert str(ei.value) == (
        "no client trained in any of the 2 rounds; round 2: all 2 sampled clients dropped out (2)"
    )
    recs = read_metrics(tmp_path / "run")
    assert [r.get("round_failed") for r in recs] == [True, True]
    assert not (tmp_path / "run" / "summary.json").exists()


def test_failure_reasons_of_secagg_rounds():
    """The reason of a SecAgg+ round that Flower halted, from its setup arithmetic."""
    import numpy as np
    from helpers import FakeManager, fitres
    from helpers import make_strategy as make

    from fedrcl_flwr.config import PrivacyConfig

    w0 = [np.zeros((2, 2), np.float32)]
    s = make(w0, privacy=PrivacyConfig(secagg=True, secagg_threshold=4), clients_per_round=3)
    s.configure_fit(1, None, FakeManager(3))
    s.evaluate(1, None)  # aggregate_fit never came: Flower halted the protocol
    assert s._failure_reason() == (
        "SecAgg+ threshold 4 is unreachable with 3 clients (each client has 3 neighbours "
        "with 3 shares)"
    )
    s2 = make(w0, privacy=PrivacyConfig(secagg=True), clients_per_round=3)
    s2.configure_fit(1, None, FakeManager(3))
    assert s2._failure_reason().startswith("SecAgg+ halted the round with 3 clients")
    # one unusable result inside the masked sum: the whole round is discarded
    s3 = make(w0, privacy=PrivacyConfig(secagg=True), clients_per_round=3)
    ins = s3.configure_fit(1, None, FakeManager(3))
    pids = [fi.config["partition_id"] for _, fi in ins]
    bad = [np.full((2, 2), np.nan, np.float32)]
    s3.aggregate_fit(
        1, [(None, fitres(bad if i == 0 else w0, 1, p)) for i, p in enumerate(pids)], []
    )
    s3.evaluate(1, None)
    assert s3._failure_reason() == (
        "SecAgg+ discarded the round: 1 of 3 results unusable and a result cannot be taken "
        f"out of the masked sum (partition {pids[0]}: array 0 contains NaN or Inf)"
    )


def test_failure_reason_counts_the_dropped_and_the_late():
    import numpy as np
    from helpers import make_strategy as make

    from fedrcl_flwr.availability import RoundOutcome

    s = make([np.zeros(2, np.float32)])
    s._outcome = RoundOutcome(reporting=[], dropped_out=[4], late=[1, 7])
    s._sampled, s._sent = [1, 4, 7], []
    assert s._failure_reason() == "all 3 sampled clients dropped out (1) or were late (2)"


@pytest.mark.integration
def test_secagg_with_dropout_trains_nothing_and_fails_with_reasons(tiny, tmp_path):
    """SecAgg+ (Flower's workflow and the real ClientApp's secaggplus_mod, in process)
    with dropout 0.9: one sampled client is left in each round, Flower halts SecAgg+, both
    rounds are failed with the reason and the run fails. Before the fix: 'clients 0,
    failures 0' on each line and a finished run."""
    from fedrcl_flwr.app.inprocess import run_inprocess
    from strategies.round_records import AllClientsFailed

    cfg = tiny(federation={"rounds": 2, "availability": {"dropout": 0.9}}, privacy={"secagg": True})
    with pytest.raises(AllClientsFailed) as ei:
        run_inprocess(cfg, tmp_path / "run")
    why = "SecAgg+ needs at least 2 clients, 1 was sent the model"
    assert str(ei.value) == f"no client trained in any of the 2 rounds; round 2: {why}"
    recs = read_metrics(tmp_path / "run")
    assert [(r["round"], r["round_failed"], r["failure_reason"]) for r in recs] == [
        (1, True, why),
        (2, True, why),
    ]
    assert all("ROUND FAILED (model unchanged): " + why in format_round_line(r, 2) for r in recs)
