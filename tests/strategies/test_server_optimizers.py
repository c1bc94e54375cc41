"""Server update rules checked against hand-computed values for two rounds."""

import math

import numpy as np
import pytest
import torch
from flwr.common import parameters_to_ndarrays
from helpers import FakeManager, fit_result

from fedrcl_flwr.run.runtime import get_weights, trainable_mask
from strategies import STRATEGIES, strategy_class


def make(name, w0, trainable=None, **params):
    return strategy_class(name)(
        initial_weights=w0,
        trainable=trainable or [True] * len(w0),
        num_clients=4,
        clients_per_round=2,
        rounds=3,
        params=params,
    )


def step(st, rnd, *client_arrays):
    st.configure_fit(rnd, None, FakeManager(4))
    out, _ = st.aggregate_fit(rnd, [fit_result(a, i) for i, a in enumerate(client_arrays)], [])
    return parameters_to_ndarrays(out)


def test_fedavgm_two_rounds():
    st = make("fedavgm", [np.array([1.0, 2.0])], momentum=0.4, server_lr=1.0)
    # round 1: avg [2,2]: Δ=[1,0], M=[1,0], w=[2,2]
    w = step(st, 1, [np.array([2.0, 1.0])], [np.array([2.0, 3.0])])
    np.testing.assert_allclose(w[0], [2.0, 2.0])
    # round 2: avg [2,4]: Δ=[0,2], M=0.4*[1,0]+[0,2]=[0.4,2], w=[2.4,4]
    w = step(st, 2, [np.array([2.0, 4.0])])
    np.testing.assert_allclose(w[0], [2.4, 4.0])


def test_fedavgm_server_lr():
    st = make("fedavgm", [np.array([0.0])], momentum=0.5, server_lr=0.5)
    w = step(st, 1, [np.array([2.0])])  # M=2, w=0+0.5*2=1
    np.testing.assert_allclose(w[0], [1.0])
    w = step(st, 2, [np.array([1.0])])  # Δ=0, M=1, w=1.5
    np.testing.assert_allclose(w[0], [1.5])


def test_fedadam_two_rounds():
    # v starting at 0 (v_init_tau_sq: false); the default τ² start: test_protocol_constants
    st = make(
        "fedadam",
        [np.array([0.0])],
        server_lr=0.01,
        beta1=0.9,
        beta2=0.99,
        tau=1e-3,
        v_init_tau_sq=False,
    )
    w = step(st, 1, [np.array([1.0])])
    # m=0.1, v=0.01 -> w1 = 0.01*0.1/(0.1+0.001)
    w1 = 0.01 * 0.1 / (0.1 + 0.001)
    np.testing.assert_allclose(w[0], [w1], rtol=1e-12)
    w = step(st, 2, [np.array([w1 + 1.0])])
    # Δ=1: m=0.9*0.1+0.1=0.19, v=0.99*0.01+0.01=0.0199
    w2 = w1 + 0.01 * 0.19 / (math.sqrt(0.0199) + 0.001)
    np.testing.assert_allclose(w[0], [w2], rtol=1e-12)


def test_fedadam_default_lr_is_not_one():
    st = make("fedadam", [np.array([0.0])])
    assert st.p["server_lr"] < 1.0


def test_fedacg_lookahead_and_update():
    st = make("fedacg", [np.array([0.0])], lam=0.85, beta=0.001)
    ins = st.configure_fit(1, None, FakeManager(4))
    sent = parameters_to_ndarrays(ins[0][1].parameters)[0]
    np.testing.assert_allclose(sent, [0.0])
    assert ins[0][1].config["acg_beta"] == pytest.approx(0.001)
    out, _ = st.aggregate_fit(1, [fit_result([np.array([1.0])])], [])
    np.testing.assert_allclose(parameters_to_ndarrays(out)[0], [1.0])  # w = avg
    ins = st.configure_fit(2, None, FakeManager(4))
    # look-ahead: w + λM = 1 + 0.85*1
    np.testing.assert_allclose(parameters_to_ndarrays(ins[0][1].parameters)[0], [1.85])
    out, _ = st.aggregate_fit(2, [fit_result([np.array([2.0])])], [])
    # Δ = 2 - 1.85 = 0.15; M = 0.85 + 0.15 = 1.0; w = 2
    np.testing.assert_allclose(parameters_to_ndarrays(out)[0], [2.0])
    np.testing.assert_allclose(st.m_buf[0], [1.0])
    ins = st.configure_fit(3, None, FakeManager(4))
    np.testing.assert_allclose(parameters_to_ndarrays(ins[0][1].parameters)[0], [2.85])


def test_feddyn_two_rounds():
    """Acar et al. Alg. 1 by hand, α = 0.5, m = 4 clients: h -= α·(|P|/m)·(avg − θ),
    θ = avg − h/α."""
    st = make("feddyn", [np.array([1.0, 2.0])], alpha=0.5)
    # round 1, |P| = 2: avg [2,2], Δ = [1,0], h = -0.5*0.5*[1,0] = [-0.25,0], θ = [2.5,2]
    w = step(st, 1, [np.array([2.0, 1.0])], [np.array([2.0, 3.0])])
    np.testing.assert_allclose(w[0], [2.5, 2.0], rtol=1e-12)
    np.testing.assert_allclose(st.h[0], [-0.25, 0.0], rtol=1e-12)
    # round 2, |P| = 1: avg [2,4], Δ = [-0.5,2], h = [-0.25,0] - 0.5*0.25*[-0.5,2]
    # = [-0.1875,-0.25], θ = [2,4] + [0.375,0.5] = [2.375,4.5]
    st.configure_fit(2, None, FakeManager(4))
    out, _ = st.aggregate_fit(2, [fit_result([np.array([2.0, 4.0])])], [])
    np.testing.assert_allclose(parameters_to_ndarrays(out)[0], [2.375, 4.5], rtol=1e-12)
    # the record's ‖h‖ = sqrt(0.1875² + 0.25²) = 0.3125
    assert st._fit_info["feddyn_h_norm"] == pytest.approx(0.3125, rel=1e-12)


class BNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.bn = torch.nn.BatchNorm1d(2)


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam", "fedacg"])
def test_buffers_averaged_counters_kept_params_optimised(name):
    net = BNNet()
    w0 = get_weights(net)
    mask = trainable_mask(net)
    keys = list(net.state_dict().keys())
    st = make(name, w0, trainable=mask)
    c1 = [w + 1.0 if np.issubdtype(w.dtype, np.floating) else w + 3 for w in w0]
    c2 = [w + 3.0 if np.issubdtype(w.dtype, np.floating) else w + 5 for w in w0]
    st.configure_fit(1, None, FakeManager(4))
    out, _ = st.aggregate_fit(1, [fit_result(c1, 0), fit_result(c2, 1)], [])
    out = dict(zip(keys, parameters_to_ndarrays(out)))
    base = dict(zip(keys, w0))
    # float buffers: plain average, whatever the server optimiser
    np.testing.assert_allclose(out["bn.running_mean"], base["bn.running_mean"] + 2.0)
    np.testing.assert_allclose(out["bn.running_var"], base["bn.running_var"] + 2.0)
    # integer counter: not averaged (max of clients), dtype kept
    assert out["bn.num_batches_tracked"] == base["bn.num_batches_tracked"] + 5
    assert out["bn.num_batches_tracked"].dtype == base["bn.num_batches_tracked"].dtype
    # trainable params: moved by the rule (FedAdam moves by ~server_lr per coordinate)
    moved = out["lin.weight"] - base["lin.weight"]
    expected = {"fedavg": 2.0, "fedavgm": 2.0, "fedacg": 2.0, "fedadam": 0.01}[name]
    np.testing.assert_allclose(moved, expected, rtol=1e-2)


def _array_lists(st) -> dict:
    """Every attribute of a strategy holding per-entry arrays (weights, optimizer state)."""
    return {
        k: v
        for k, v in vars(st).items()
        if isinstance(v, list)
        and v
        and all(a is None or isinstance(a, np.ndarray) for a in v)
        and any(isinstance(a, np.ndarray) for a in v)
    }


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_state_roundtrip(name):
    """Resume = a fresh instance + load_state_dict: every registered strategy continues
    exactly as the uninterrupted one, and every array state it keeps is checkpointed."""
    a = make(name, [np.array([0.0, 1.0]), np.array([2.0])], trainable=[True, False])
    step(a, 1, [np.array([1.0, 1.0]), np.array([3.0])])
    step(a, 2, [np.array([2.0, 0.5]), np.array([1.0])], [np.array([0.0, 3.0]), np.array([2.0])])
    state = a.state_dict()
    b = make(name, [np.array([0.0, 1.0]), np.array([2.0])], trainable=[True, False])
    b.load_state_dict(state)
    sa, sb = _array_lists(a), _array_lists(b)
    assert sa.keys() == sb.keys()
    for k in sa:  # a buffer the base does not know of would differ here
        for x, y in zip(sa[k], sb[k]):
            assert (x is None and y is None) or np.array_equal(x, y), k
    if name != "fedavg":
        assert a.buffers, "a server optimizer declares its state"
        assert any(np.any(getattr(a, buf)[0] != 0) for buf in a.buffers)
    wa = step(a, 3, [np.array([2.0, 0.0]), np.array([0.0])])
    wb = step(b, 3, [np.array([2.0, 0.0]), np.array([0.0])])
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)
    # the checkpoint is a copy: training on does not change it
    before = [np.copy(w) for w in state["weights"]]
    step(a, 4, [np.array([9.0, 9.0]), np.array([9.0])])
    for x, y in zip(before, state["weights"]):
        np.testing.assert_array_equal(x, y)


def test_resumed_round_is_the_run_round():
    st = make("fedavg", [np.array([0.0])])
    st.round_offset = 5
    ins = st.configure_fit(1, None, FakeManager(4))
    assert st.run_round(1) == 6 and {fi.config["run_round"] for _, fi in ins} == {6}
