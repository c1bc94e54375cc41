"""Baseline methods: each loss on a hand-computable case, the FedDyn server rule over two
rounds, per-client state (MOON's previous model, FedDyn's gradient correction) on disk,
and every method end to end in process (alone and with server optimizers)."""

import math

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

from clients import client_class
from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.losses import baselines as B
from fedrcl_flwr.run import runtime
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.training import Batch

T = torch.tensor
close = pytest.approx


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one intra-op thread is faster, and far faster on a busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ----------------------------------------------------------------- loss functions
def test_fedprox_client_term():
    class Stub(client_class("fedprox")):
        def __init__(self):  # no data needed: only the term wiring is checked
            self.p, self.device, self._received = (
                {"mu": 0.1, "halve": True},
                torch.device("cpu"),
                None,
            )

    c = Stub()
    c.model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        c.model.weight.copy_(T([[1.0, 2.0]]))
        c.model.bias.fill_(3.0)
    c.global_weights = [np.zeros((1, 2), np.float32), np.ones(1, np.float32)]
    ce, prox = c.loss_terms()
    assert (ce.name, prox.name, prox.weight) == ("ce", "prox", close(0.05))
    b = Batch(x=None, y=None, logits=None, feats=None, model=c.model)
    assert float(prox.fn(b).detach()) == close(1 + 4 + 4)  # ‖(1,2)-0‖² + (3-1)²


def test_moon_contrastive_loss():
    z = T([[1.0, 0.0], [0.0, 2.0]])
    zg = T([[3.0, 0.0], [1.0, 0.0]])  # cos: 1, 0
    zp = T([[0.0, 1.0], [0.0, 5.0]])  # cos: 0, 1
    want = (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(2))) / 2  # τ = 0.5
    assert float(B.moon_contrastive_loss(z, zg, zp, tau=0.5)) == close(want, rel=1e-6)


def test_fedlc_calibrated_ce_absent_classes():
    logits = torch.zeros(1, 3, requires_grad=True)
    y = T([0])
    counts = T([16.0, 1.0, 0.0])  # offsets τ·n^(-1/4): 0.5, 1, inf
    drop = B.fedlc_loss(logits, y, counts, tau=1.0, absent="drop")
    assert float(drop.detach()) == close(math.log(1 + math.exp(-0.5)), rel=1e-6)
    drop.backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[0, 2]) == 0.0
    clamp = B.fedlc_loss(logits, y, counts, tau=1.0, absent="clamp")
    assert float(clamp.detach()) == close(math.log(1 + 2 * math.exp(-0.5)), rel=1e-6)
    # τ = 0: plain cross-entropy over the classes present / all classes
    assert float(B.fedlc_loss(logits.detach(), y, counts, 0.0, "clamp")) == close(math.log(3))


def test_fedntd_not_true_distillation():
    local = T([[5.0, 0.0, 0.0]])  # not-true (classes 1, 2): uniform
    glob = T([[-7.0, math.log(3.0), 0.0]])  # not-true: (3/4, 1/4)
    want = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert float(B.fedntd_loss(local, glob, T([0]), T=1.0)) == close(want, rel=1e-6)
    # τ = 2: softmax(log3/2, 0) = (√3, 1)/(√3+1), times τ²
    p = math.sqrt(3) / (math.sqrt(3) + 1)
    want2 = 4 * (p * math.log(p / 0.5) + (1 - p) * math.log((1 - p) / 0.5))
    assert float(B.fedntd_loss(local, glob, T([0]), T=2.0)) == close(want2, rel=1e-5)


def test_feddecorr_official_normalisation():
    # perfectly correlated columns: ẑ = (-1, 0, 1) in both, ẑᵀẑ off-diagonal = 2
    z = T([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])
    assert float(B.feddecorr_loss(z)) == close(2.0**2 / 3, rel=1e-6)  # mean(4, 4) / N
    # uncorrelated columns: 0
    z0 = T([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    assert float(B.feddecorr_loss(z0)) == close(0.0, abs=1e-7)
    assert float(B.feddecorr_loss(T([[1.0, 2.0]]))) == 0.0


def test_fedmlb_branch_losses_and_gradient_path():
    main = T([[0.0, 0.0]], requires_grad=True)
    hyb = T([[math.log(3.0), 0.0]], requires_grad=True)
    ce, kl = B.fedmlb_branch_losses(main, [hyb, hyb], T([0]))
    assert float(ce.detach()) == close(-math.log(0.75), rel=1e-6)
    assert float(kl.detach()) == close(0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel=1e-6)
    (ce + kl).backward()
    assert main.grad.abs().sum() > 0 and hyb.grad.abs().sum() > 0


def test_fitnet_hint():
    assert float(B.fitnet_hint_loss(T([[1.0, 2.0]]), T([[0.0, 0.0]]))) == close(2.5)


def test_fedproto_mse_to_class_prototype():
    z = T([[1.0, 1.0], [2.0, 0.0]])
    # class 0 has a prototype, class 1 has none (adds zero but counts in the mean)
    loss = B.fedproto_loss(z, T([0, 1]), T([[0.0, 1.0]]), T([0]), num_classes=2)
    assert float(loss) == close(1.0 / 4)


def test_fedproc_contrast():
    z = T([[1.0, 0.0], [0.0, 1.0]])
    protos, labels = T([[2.0, 0.0], [0.0, 3.0]]), T([0, 1])
    # sample 0 (class 0): cos 1 vs 0; sample 1 (class 2): no prototype; / batch size
    loss = B.fedproc_loss(z, T([0, 2]), protos, labels, tau=1.0)
    assert float(loss) == close(math.log(1 + math.exp(-1)) / 2, rel=1e-6)


def test_fedproc_alpha_schedule():
    from clients.fedproc import fedproc_alpha

    assert [fedproc_alpha(t, 5) for t in range(1, 6)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert fedproc_alpha(1, 1) == 0.0


def test_fpl_cluster_contrast_plus_unbiased_prototype():
    z = T([[1.0, 0.0]])
    protos = T([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # two clusters of class 0, one of 1
    labels = T([0, 0, 1])
    e = math.e
    info = -math.log((e + 1) / (e + 1 + 1 / e))  # cos 1, 0 positive; -1 negative
    mse = (0.5**2 + 0.5**2) / 2  # unbiased prototype (0.5, 0.5)
    got = B.fpl_loss(z, T([0]), protos, labels, num_classes=2, tau=1.0)
    assert float(got) == close(info + mse, rel=1e-6)
    # a sample without prototypes is left out of the mean
    got2 = B.fpl_loss(T([[1.0, 0.0], [5.0, 5.0]]), T([0, 3]), protos, labels, 4, tau=1.0)
    assert float(got2) == close(info + mse, rel=1e-6)
    # the authors' per-sample loop: the same closed form, over the batch or the valid ones
    official = B.fpl_loss_official(z, T([0]), protos, labels, tau=1.0)
    assert float(official) == close(info + mse, rel=1e-6)
    two = T([[1.0, 0.0], [5.0, 5.0]])
    assert float(B.fpl_loss_official(two, T([0, 3]), protos, labels, 1.0, "valid")) == close(
        info + mse, rel=1e-6
    )
    assert float(B.fpl_loss_official(two, T([0, 3]), protos, labels, 1.0, "batch")) == close(
        (info + mse) / 2, rel=1e-6
    )


def test_fedpcl_global_and_local_prototype_contrast():
    z = T([[3.0, 0.0]])  # normalised to (1, 0)
    lg, lp = B.fedpcl_loss(
        z,
        T([0]),
        T([[1.0, 0.0], [0.0, 1.0]]),
        T([0, 1]),
        T([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]]),
        T([0, 0, 1]),
        tau=1.0,
    )
    assert float(lg) == close(math.log(1 + math.exp(-1)), rel=1e-6)
    want = 0.5 * (math.log(1 + math.exp(-2)) + math.log(1 + math.exp(-1)))
    assert float(lp) == close(want, rel=1e-6)
    _, none = B.fedpcl_loss(z, T([0]), T([[1.0, 0.0]]), T([0]))
    assert float(none) == 0.0


def test_feddyn_penalty():
    p, a, g = [T([2.0, 3.0])], [T([1.0, 1.0])], [T([1.0, -1.0])]
    assert float(B.feddyn_penalty(p, a, g, alpha=0.1)) == close(0.05 * 5 - (2 - 3))
    assert float(B.feddyn_penalty(p, a, None, alpha=0.1)) == close(0.25)


# ------------------------------------------------------------- FedDyn server rule
def _res(arrays, pid):
    return (
        None,
        FitRes(
            Status(Code.OK, ""),
            ndarrays_to_parameters([np.asarray(a, np.float32) for a in arrays]),
            10,
            {"partition_id": pid, "train_loss": 0.5},
        ),
    )


def test_feddyn_server_two_rounds_by_hand():
    from strategies import strategy_class

    st = strategy_class("feddyn")(
        initial_weights=[np.zeros(2, np.float32), np.zeros(1, np.float32)],
        trainable=[True, False],
        num_clients=4,
        clients_per_round=2,
        rounds=2,
        params={"alpha": 0.1},
    )
    # round 1: θ⁰ = 0; clients (1,2), (3,4) -> mean (2,3), Σ(θ_k − θ⁰) = (4,6)
    # h¹ = −0.1·(1/4)·(4,6) = (−0.1, −0.15);  θ¹ = (2,3) + h¹·(−1/0.1) = (3, 4.5)
    st.aggregate_fit(1, [_res([[1, 2], [2]], 0), _res([[3, 4], [4]], 1)], [])
    assert st.h[0] == close([-0.1, -0.15])
    assert st.weights[0] == close([3.0, 4.5]) and st.weights[1] == close([3.0])
    # round 2: clients (5,5), (3,6) -> mean (4,5.5), Σ(θ_k − θ¹) = (2, 2)
    # h² = h¹ − 0.1·(1/4)·(2,2) = (−0.15, −0.2);  θ² = (4,5.5) + (1.5, 2) = (5.5, 7.5)
    st.aggregate_fit(2, [_res([[5, 5], [0]], 2), _res([[3, 6], [1]], 3)], [])
    assert st.h[0] == close([-0.15, -0.2])
    assert st.weights[0] == close([5.5, 7.5]) and st.weights[1] == close([0.5])
    state = st.state_dict()
    st2 = strategy_class("feddyn")(
        initial_weights=[np.zeros(2, np.float32), np.zeros(1, np.float32)],
        trainable=[True, False],
        num_clients=4,
        clients_per_round=2,
        rounds=2,
        params={"alpha": 0.1},
    )
    st2.load_state_dict(state)
    assert st2.h[0] == close([-0.15, -0.2])


def test_feddyn_alpha_is_one_server_key_sent_to_clients(tiny):
    from fedrcl_flwr.app.validate import validate_components
    from strategies import strategy_class

    # α is server.params.alpha only; the client has no alpha key and needs FedDyn's server
    with pytest.raises(ConfigError, match=r"client.params: unknown key\(s\) alpha"):
        validate_components(
            tiny(
                client={"method": "feddyn", "params": {"alpha": 0.1}}, server={"strategy": "feddyn"}
            )
        )
    with pytest.raises(ConfigError, match="'server.strategy' must be feddyn"):
        validate_components(tiny(client={"method": "feddyn"}))
    validate_components(tiny(client={"method": "feddyn"}, server={"strategy": "feddyn"}))
    st = strategy_class("feddyn")(
        initial_weights=[np.zeros(2, np.float32)],
        trainable=[True],
        num_clients=4,
        clients_per_round=2,
        rounds=2,
        params={"alpha": 0.03},
    )

    class M:
        def wait_for(self, n, timeout=0):
            return True

        def all(self):
            return {"a": object(), "b": object()}

    ins = st.configure_fit(1, None, M())
    assert [fi.config["feddyn_alpha"] for _, fi in ins] == [0.03, 0.03]


# ----------------------------------------------------------- models / helpers
@pytest.mark.parametrize(
    "name,shape",
    [("cnn4", (2, 1, 28, 28)), ("cnn5", (2, 3, 32, 32)), ("resnet18_gn", (2, 3, 16, 16))],
)
def test_block_interface_reproduces_forward(name, shape):
    from fedrcl_flwr.models import build_model

    m = build_model(name, num_classes=5, in_channels=shape[1], image_size=shape[2])
    x = torch.randn(*shape)
    logits, feats = m(x, return_features=True)
    maps = m.block_forward(x)
    assert torch.equal(maps[-1], feats["penultimate"])
    for k, h in enumerate(maps):
        out, f = m.forward_from(k, h, return_features=True)
        assert torch.allclose(out, logits, atol=1e-5)
        assert torch.allclose(f["penultimate"], feats["penultimate"], atol=1e-5)
    with pytest.raises(ValueError):
        m.forward_from(len(maps), maps[-1])


def test_fedmlb_needs_block_model(tiny):
    from fedrcl_flwr.app.validate import validate_components

    cfg = tiny(client={"method": "fedmlb"}, model={"name": "cnn5", "params": {"projector": 16}})
    with pytest.raises(ConfigError, match="block_forward"):
        validate_components(cfg)
    validate_components(tiny(client={"method": "fedmlb"}))


def _client(cfg, state_dir=None):
    return client_class(cfg.client.method)(cfg, state_dir=state_dir)


def _initial(cfg):
    return runtime.get_weights(runtime.initial_model(cfg, runtime.load_bundle(cfg)))


def test_frozen_model_is_a_pooled_frozen_copy(tiny, tmp_path):
    cfg = tiny(client={"method": "fitnet"})
    c = _client(cfg)
    c.global_weights = _initial(cfg)
    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    m1 = c.frozen_model(slot="fresh-slot")  # built now: must not consume the caller's RNG
    assert torch.equal(torch.rand(3), before)
    assert not m1.training and not any(p.requires_grad for p in m1.parameters())
    local = c._model()
    assert m1 is not local and any(p.requires_grad for p in local.parameters())
    w = [a + 1 if a.dtype.kind == "f" else a for a in c.global_weights]
    m2 = c.frozen_model(w, slot="fresh-slot")
    assert m2 is m1  # one instance per slot and process (the runtime's model pool)
    assert np.allclose(runtime.get_weights(m2)[0], w[0])
    assert c.frozen_model(slot="other") is not m1
    assert runtime.worker_model(cfg, runtime.load_bundle(cfg), c.device) is local


# ------------------------------------------------------- per-client state on disk
def test_moon_previous_model_saved_compact_and_reused(tiny, tmp_path):
    cfg = tiny(client={"method": "moon"})
    w0 = _initial(cfg)
    state = tmp_path / "state"
    w1, _, m1 = _client(cfg, str(state)).fit(w0, {"run_round": 1, "partition_id": 3})
    assert m1["moon_prev"] == 0 and "loss_moon" not in m1
    saved = torch.load(state / "moon_prev_3.pt", weights_only=True)
    assert all(v.dtype == torch.float16 for v in saved.values())
    assert np.allclose(saved["fc.weight"].float().numpy(), w1[-2], atol=1e-2)
    n_params = sum(a.size for a in w0)
    assert (state / "moon_prev_3.pt").stat().st_size < 2 * n_params + 20_000  # fp16
    # a fresh client instance (as every round in simulation) finds it next round
    _, _, m2 = _client(cfg, str(state)).fit(w0, {"run_round": 2, "partition_id": 3})
    assert m2["moon_prev"] == 1 and math.isfinite(m2["loss_moon"]) and m2["loss_moon"] > 0
    # another partition has no previous model
    _, _, m3 = _client(cfg, str(state)).fit(w0, {"run_round": 2, "partition_id": 4})
    assert m3["moon_prev"] == 0


def test_feddyn_gradient_state_update(tiny, tmp_path):
    cfg = tiny(client={"method": "feddyn"}, server={"strategy": "feddyn"})
    w0 = _initial(cfg)
    state = tmp_path / "state"
    c = _client(cfg, str(state))
    w1, _, m1 = c.fit(w0, {"run_round": 1, "partition_id": 2, "feddyn_alpha": 0.1})
    assert m1["feddyn_state"] == 0
    g = torch.load(state / "feddyn_grad_2.pt", weights_only=True)
    names = list(c.model.state_dict().keys())
    # ∇L_k(θ_k^1) = 0 − α(θ_k^1 − θ^0)
    for n, a0, a1 in zip(names, w0, w1):
        assert np.allclose(g[n].numpy(), -0.1 * (a1 - a0), atol=1e-7)
    w2, _, m2 = _client(cfg, str(state)).fit(
        w1, {"run_round": 2, "partition_id": 2, "feddyn_alpha": 0.1}
    )
    assert m2["feddyn_state"] == 1 and math.isfinite(m2["loss_dyn"])
    g2 = torch.load(state / "feddyn_grad_2.pt", weights_only=True)
    n = names[0]
    i = 0
    assert np.allclose(g2[n].numpy(), g[n].numpy() - 0.1 * (w2[i] - w1[i]), atol=1e-6)


# ------------------------------------------------------------------ end to end
# method -> (loss terms expected in the last round's record, config overrides)
E2E = {
    "fedscl": (["ce", "rcl"], {}),
    "fedcl": (["ce", "cl"], {}),
    "freeze": (["ce"], {}),
    "univarfl": (["ce", "variance", "uniformity"], {"model": {"params": {"projector": 16}}}),
    "fedprox": (["ce", "prox"], {}),
    "moon": (
        ["ce", "moon"],
        {"federation": {"num_clients": 2, "clients_per_round": 2}, "client": {"batch_size": 100}},
    ),
    "fedlc": (["lc"], {}),
    "fedntd": (["ce", "ntd"], {}),
    "feddecorr": (["ce", "decorr"], {}),
    "fedmlb": (["ce", "mlb_ce", "mlb_kl"], {}),
    "fitnet": (["ce", "hint"], {}),
    "fedproc": (["ce", "proc"], {"client": {"params": {"alpha": 0.5}}}),
    "fedproto": (["ce", "proto"], {}),
    "fpl": (["ce", "fpl"], {}),
    "fedpcl": (["ce", "pcl_global", "pcl_local"], {}),
    "feddyn": (
        ["ce", "dyn"],
        {
            "federation": {"num_clients": 2, "clients_per_round": 2},
            "client": {"batch_size": 100},
            "server": {"strategy": "feddyn"},
        },
    ),
}


def _run(tiny, tmp_path, method, strategy=None, **over):
    sections = {k: dict(v) for k, v in over.items()}
    sections.setdefault("federation", {})["rounds"] = 2
    sections["client"] = {"method": method, **sections.get("client", {})}
    if strategy:
        sections["server"] = {**sections.get("server", {}), "strategy": strategy}
    cfg = tiny(**sections)
    st = run_inprocess(cfg, tmp_path / "run")
    return cfg, st, read_metrics(tmp_path / "run")


def _check(recs, st, terms):
    assert len(recs) == 2 and all(r["failures"] == 0 for r in recs)
    assert all(math.isfinite(r["train_loss"]) and math.isfinite(r["test_loss"]) for r in recs)
    for t in terms:
        assert math.isfinite(recs[-1][f"train_loss_{t}"]), t
    assert all(np.all(np.isfinite(w)) for w in st.weights if w.dtype.kind == "f")


@pytest.mark.integration
@pytest.mark.parametrize("method", sorted(E2E))
def test_method_runs_two_rounds_in_process(tiny, tmp_path, method):
    terms, over = E2E[method]
    cfg, st, recs = _run(tiny, tmp_path, method, **over)
    _check(recs, st, terms)
    if method in ("moon", "feddyn"):  # state written under the run dir, used in round 2
        files = sorted(p.name for p in (cfg.output_dir() / "client_state").glob("*.pt"))
        prefix = {"moon": "moon_prev", "feddyn": "feddyn_grad"}[method]
        assert files == [f"{prefix}_0.pt", f"{prefix}_1.pt"]
    if method == "moon":  # first participation: no previous model, no term
        assert "train_loss_moon" not in recs[0]
    if method == "feddyn":
        assert recs[-1]["feddyn_h_norm"] > 0
    if method in ("fedproto", "fedproc", "fpl", "fedpcl"):
        assert recs[-1]["signals_accepted"] == 2 and recs[0]["signal_bytes_down"] == 0
        assert recs[-1]["signal_bytes_down"] > 0


@pytest.mark.integration
@pytest.mark.parametrize(
    "method,strategy", [("fedmlb", "fedacg"), ("fedproto", "fedadam"), ("moon", "fedacg")]
)
def test_baseline_combines_with_server_optimizers(tiny, tmp_path, method, strategy):
    terms, over = E2E[method]
    _, st, recs = _run(tiny, tmp_path, method, strategy, **over)
    _check(recs, st, terms + (["acg"] if strategy == "fedacg" else []))


def test_fedmlb_trains_through_its_forward_hook_without_patching_the_model(tiny):
    from clients.fedmlb import MAPS_KEY, block_forward

    cfg = tiny(client={"method": "fedmlb"})
    c = _client(cfg)
    w0 = _initial(cfg)
    _, _, m = c.fit(w0, {"run_round": 1, "partition_id": 0})
    assert math.isfinite(m["loss_mlb_ce"]) and math.isfinite(m["loss_mlb_kl"])
    assert "forward" not in vars(c.model)  # the shared worker model is untouched
    model = c._model()
    runtime.set_weights(model, w0)
    x = torch.randn(3, 3, 16, 16)
    model.eval()
    logits, feats = block_forward(model, x, True)
    assert torch.allclose(logits, model(x), atol=1e-5)  # the model's own function
    assert len(feats[MAPS_KEY]) == 4 and torch.equal(feats[MAPS_KEY][-1], feats["penultimate"])


@pytest.mark.parametrize("training", [True, False])
def test_signal_embedding_restores_the_model_mode(tiny, training):
    from fedrcl_flwr.representation import embed

    cfg = tiny(client={"method": "fedproto"})
    c = _client(cfg)
    bundle = runtime.load_bundle(cfg)
    c.data = c.local_data(2)
    c.model = c._model()
    c.model.train(training)
    feats, labels = c.embed_local_data()
    assert c.model.training is training
    assert feats.shape == (c.data.size, 128) and feats.dtype == np.float32
    np.testing.assert_array_equal(labels, bundle.train_labels[c.data.indices])
    # the same numbers as the server-side embedding of the same samples
    z, _ = embed(c.model, bundle.train, c.device, indices=c.data.indices)
    np.testing.assert_allclose(feats, z.numpy(), rtol=1e-6)
    c.model.eval()
    with torch.no_grad():
        x, _ = bundle.train.plain().get_batch(c.data.indices[:4])
        direct = c.model(x, return_features=True)[1]["penultimate"]
    np.testing.assert_allclose(feats[:4], direct.numpy(), rtol=1e-5, atol=1e-6)
