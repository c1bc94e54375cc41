"""The client <-> server protocol (fedrcl_flwr/protocol.py): the wire entries of the fit and
evaluate instructions and reports, the strategy's typed values for the clients, the
strategy's client-side loss terms through its declared hook, and the round's kept
results handed to ``server_update``. In process, seconds."""

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays
from helpers import FakeManager, fit_result

from fedrcl_flwr.protocol import (
    EvaluateInstructions,
    EvaluateReport,
    FitInstructions,
    FitReport,
    ProtocolError,
    StrategyParams,
)
from fedrcl_flwr.run import runtime
from fedrcl_flwr.signals import SignalSet, encode_signals
from strategies import STRATEGIES, strategy_class
from strategies.base import FederatedStrategy
from strategies.fedacg import FedACGParams
from strategies.feddyn import FedDynParams


def test_fit_instructions_wire_entries_round_trip():
    sig = encode_signals(SignalSet(np.ones((2, 3), np.float32), np.array([0, 1]), np.array([4, 5])))
    ins = FitInstructions.build(7, 3, signals=(None, sig), strategy=FedACGParams(acg_beta=0.002))
    config = ins.to_config()
    assert config == {"run_round": 7, "partition_id": 3, "signals_global": sig, "acg_beta": 0.002}
    # Flower's own entries (its client-side DP clipping norm) pass through untouched
    back = FitInstructions.from_config({**config, "clipping_norm": 1.5})
    assert (back.run_round, back.partition_id) == (7, 3)
    assert not hasattr(back, "lr")  # the learning rate is the client's schedule, never sent
    assert back.signals_local is None and back.signals_global == sig
    assert back.strategy_entries == {"acg_beta": 0.002, "clipping_norm": 1.5}
    assert back.strategy_params(FedACGParams) == FedACGParams(acg_beta=0.002)
    # the defaults of a bare config (a client driven by hand)
    bare = FitInstructions.from_config({})
    assert (bare.run_round, bare.partition_id) == (1, None)


def test_strategy_params_missing_or_mistyped_entry_is_named():
    ins = FitInstructions.from_config({"run_round": 2})
    with pytest.raises(ProtocolError, match="lack 'feddyn_alpha'"):
        ins.strategy_params(FedDynParams)
    for bad in ("0.1", True, b"x"):
        with pytest.raises(ProtocolError, match="'feddyn_alpha' .* must be float"):
            FitInstructions.from_config({"feddyn_alpha": bad}).strategy_params(FedDynParams)
    assert (
        FitInstructions.from_config({"feddyn_alpha": 1}).strategy_params(FedDynParams).feddyn_alpha
        == 1.0
    )
    with pytest.raises(ProtocolError, match="'run_round' must be a whole number"):
        FitInstructions.from_config({"run_round": "two"})
    with pytest.raises(ProtocolError, match="'signals_local' must be bytes"):
        FitInstructions.from_config({"signals_local": "abc"})
    with pytest.raises(ProtocolError, match="reuse protocol names"):
        FitInstructions(strategy_entries={"partition_id": 1}).to_config()


def test_every_strategy_sends_declared_fields_outside_the_protocol_names():
    from fedrcl_flwr.protocol import FIT_INSTRUCTION_KEYS

    for name in STRATEGIES:
        st = strategy_class(name)(
            initial_weights=[np.zeros(2, np.float32)],
            trainable=[True],
            num_clients=4,
            clients_per_round=2,
            rounds=2,
        )
        params = st.client_params(1)
        if params is None:
            continue
        assert isinstance(params, StrategyParams), name
        assert not set(params.to_entries()) & set(FIT_INSTRUCTION_KEYS), name
        config = st.fit_instructions(1, 0).to_config()
        assert FitInstructions.from_config(config).strategy_params(type(params)) == params


def test_fit_report_wire_entries_round_trip():
    report = FitReport(
        partition_id=4,
        train_loss=0.75,
        steps=12,
        fit_time_s=1.5,
        node="host",
        term_losses={"ce": 0.5, "rcl": 0.25},
        local_repr={"effective_rank": 9.0},
        signals=b"npz",
        num_signals=3,
        method_metrics={"moon_prev": 1},
    )
    metrics = report.to_metrics()
    assert metrics == {
        "partition_id": 4,
        "train_loss": 0.75,
        "steps": 12,
        "fit_time_s": 1.5,
        "node": "host",
        "loss_ce": 0.5,
        "loss_rcl": 0.25,
        "local_repr_effective_rank": 9.0,
        "signals": b"npz",
        "num_signals": 3,
        "moon_prev": 1,
    }
    assert FitReport.from_metrics(metrics) == report
    # what a minimal client reports; a node that is not text is unknown
    small = FitReport.from_metrics({"partition_id": 2, "train_loss": 1.0, "node": 3})
    assert (small.partition_id, small.train_loss, small.node, small.steps) == (2, 1.0, None, None)
    assert FitReport.from_metrics({}).partition_id == -1
    for name in ("node", "loss_x", "local_repr_y", "signals"):
        with pytest.raises(ProtocolError, match="reuse protocol names"):
            FitReport(method_metrics={name: 1}).to_metrics()


def test_malformed_fit_report_drops_the_result_not_the_round():
    st = strategy_class("fedavg")(
        initial_weights=[np.zeros(2, np.float32)],
        trainable=[True],
        num_clients=4,
        clients_per_round=2,
        rounds=3,
    )
    st.configure_fit(1, None, FakeManager(4))
    good = fit_result(
        [np.array([2.0, 4.0], np.float32)], metrics={"partition_id": 1, "train_loss": 0.5}
    )
    bad = fit_result(
        [np.array([9.0, 9.0], np.float32)], metrics={"partition_id": "one", "train_loss": 0.5}
    )
    out, _ = st.aggregate_fit(1, [bad, good], [])
    np.testing.assert_allclose(parameters_to_ndarrays(out)[0], [2.0, 4.0])
    assert st._fit_info["num_clients"] == 1 and st._fit_info["failures"] == 1
    assert "malformed fit report" in st.ledger.first_client_error


def test_server_update_receives_the_rounds_kept_results():
    seen = []

    class Probe(FederatedStrategy):
        def server_update(self, run_round, average, results):
            seen.append(
                (
                    run_round,
                    [r.partition_id for r in results],
                    [r.num_examples for r in results],
                    [r.report.train_loss for r in results],
                    [float(r.weights[0][0]) for r in results],
                )
            )
            self.weights = average
            return {"probe_clients": len(results)}

    st = Probe(
        initial_weights=[np.zeros(1, np.float32)],
        trainable=[True],
        num_clients=4,
        clients_per_round=3,
        rounds=3,
        round_offset=5,
    )
    st.configure_fit(1, None, FakeManager(4))
    results = [
        fit_result(
            [np.array([3.0], np.float32)], metrics={"partition_id": 3, "train_loss": 0.3}, n=7
        ),
        fit_result(
            [np.array([np.nan], np.float32)], metrics={"partition_id": 2, "train_loss": 0.2}
        ),
        fit_result(
            [np.array([1.0], np.float32)], metrics={"partition_id": 0, "train_loss": 0.1}, n=5
        ),
    ]
    out, _ = st.aggregate_fit(1, results, [])
    # the run's round (resumed: offset 5), the kept clients by partition id (NaN dropped)
    assert seen == [(6, [0, 3], [5, 7], [0.1, 0.3], [1.0, 3.0])]
    assert st._fit_info["probe_clients"] == 2 and st._fit_info["failures"] == 1
    np.testing.assert_allclose(parameters_to_ndarrays(out)[0], [2.0])  # uniform mean


def _spy_terms(monkeypatch):
    import clients.local_round as local_round

    seen = []
    real = local_round.train_local

    def spy(model, batches, terms, settings, device, **kw):
        seen.append([(t.name, t.weight) for t in terms])
        return real(model, batches, terms, settings, device, **kw)

    monkeypatch.setattr(local_round, "train_local", spy)
    return seen


def test_fedacg_term_comes_from_the_strategys_hook(tiny, monkeypatch):
    from clients import client_class

    seen = _spy_terms(monkeypatch)
    cfg = tiny(server={"strategy": "fedacg", "params": {"beta": 0.003}})
    w0 = runtime.get_weights(runtime.initial_model(cfg, runtime.load_bundle(cfg)))
    st = strategy_class("fedacg")(
        initial_weights=w0,
        trainable=[True] * len(w0),
        num_clients=8,
        clients_per_round=2,
        rounds=3,
        params=cfg.server.params,
    )
    client_class("fedavg")(cfg).fit(w0, st.fit_instructions(1, 0).to_config())
    plain = tiny()
    client_class("fedavg")(plain).fit(w0, FitInstructions.build(1, 0).to_config())
    assert seen == [[("ce", 1.0), ("acg", 0.003)], [("ce", 1.0)]]
    # FedACG configured but its β not sent: one line naming the entry
    with pytest.raises(ProtocolError, match="lack 'acg_beta'"):
        client_class("fedavg")(cfg).fit(w0, {"run_round": 1, "partition_id": 0})


def test_any_strategy_adds_client_terms_through_the_declared_hook(tiny, monkeypatch):
    import clients.base as base
    from clients import client_class

    class Anchored(FederatedStrategy):
        @classmethod
        def client_loss_terms(cls, client, ins):
            weight = float(ins.strategy_entries["anchor_weight"])
            return [client.distance_to_received_term("anchor", weight)]

    monkeypatch.setattr(
        base, "strategy_class", lambda name: Anchored if name == "fedavg" else strategy_class(name)
    )
    seen = _spy_terms(monkeypatch)
    cfg = tiny(client={"method": "fedprox"})
    w0 = runtime.get_weights(runtime.initial_model(cfg, runtime.load_bundle(cfg)))
    client = client_class("fedprox")(cfg)
    client.fit(w0, {"run_round": 1, "partition_id": 0, "anchor_weight": 0.5})
    assert [n for n, _ in seen[0]] == ["ce", "prox", "anchor"] and seen[0][2][1] == 0.5


def test_evaluate_instructions_and_report_round_trip():
    ins = EvaluateInstructions(run_round=4, partition_ids=(0, 5, 7))
    assert ins.to_config() == {"run_round": 4, "partition_ids": "0,5,7"}
    assert EvaluateInstructions.from_config(ins.to_config()) == ins
    assert EvaluateInstructions.from_config({"partition_id": 2}) == EvaluateInstructions(
        run_round=0, partition_ids=None, partition_id=2
    )
    with pytest.raises(ProtocolError, match="partition_ids"):
        EvaluateInstructions.from_config({"partition_ids": "1,x"})
    report = EvaluateReport({5: (3, 4, 2.0), 0: (1, 2, 1.0)})
    metrics = report.to_metrics()
    assert metrics == {"client_eval": '{"0": [1, 2, 1.0], "5": [3, 4, 2.0]}'}
    assert EvaluateReport.from_metrics(metrics) == report
    assert report.num_samples == 6 and report.mean_loss == pytest.approx(0.5)
    assert EvaluateReport.from_metrics({"client_eval": "{bad"}).results == {}
    assert EvaluateReport.from_metrics({"client_eval": '{"1": [5, 4, 0.0]}'}).results == {}
