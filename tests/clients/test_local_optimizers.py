"""client.optimizer: sgd (momentum, Nesterov) | adam | adamw — closed-form first steps, a
fresh state every round, schema validation, and every method trains with Adam."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from clients import CLIENTS
from fedrcl_flwr.app.inprocess import run_inprocess
from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.run.results import read_metrics
from fedrcl_flwr.training import LocalTrainSettings, cross_entropy_term, make_optimizer, train_local


def _param(values):
    return nn.Parameter(torch.tensor(values, dtype=torch.float64))


def _step(settings, p, grad, steps=1):
    opt = make_optimizer([p], settings)
    for _ in range(steps):
        opt.zero_grad()
        p.grad = grad.clone()
        opt.step()
    return p.detach().clone()


def test_sgd_nesterov_two_steps_closed_form():
    lr, mu, wd = 0.1, 0.9, 0.01
    p0 = torch.tensor([1.0, -2.0], dtype=torch.float64)
    g = torch.tensor([0.5, 0.25], dtype=torch.float64)
    s = LocalTrainSettings(lr=lr, momentum=mu, nesterov=True, weight_decay=wd)
    got = _step(s, _param(p0.tolist()), g, steps=2)
    # PyTorch's Nesterov: d = g + wd p; b = mu b + d; p -= lr (d + mu b)
    p, b = p0.clone(), torch.zeros(2, dtype=torch.float64)
    for _ in range(2):
        d = g + wd * p
        b = mu * b + d
        p = p - lr * (d + mu * b)
    assert torch.allclose(got, p)
    plain = _step(
        LocalTrainSettings(lr=lr, momentum=mu, weight_decay=wd), _param(p0.tolist()), g, steps=2
    )
    assert not torch.allclose(plain, p)  # nesterov is really on


def test_adam_and_adamw_first_step_closed_form():
    lr, wd, eps = 1e-3, 0.1, 1e-8
    p0 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    g = torch.tensor([0.3, -0.02, 4.0], dtype=torch.float64)
    # Adam, L2 decay: d = g + wd p; first bias-corrected step is lr * d / (|d| + eps)
    d = g + wd * p0
    adam = _step(
        LocalTrainSettings(lr=lr, optimizer="adam", weight_decay=wd, eps=eps),
        _param(p0.tolist()),
        g,
    )
    assert torch.allclose(adam, p0 - lr * d / (d.abs() + eps))
    # AdamW, decoupled decay: p (1 - lr wd) - lr g / (|g| + eps)
    adamw = _step(
        LocalTrainSettings(lr=lr, optimizer="adamw", weight_decay=wd, eps=eps),
        _param(p0.tolist()),
        g,
    )
    assert torch.allclose(adamw, p0 * (1 - lr * wd) - lr * g / (g.abs() + eps))
    opt = make_optimizer(
        [_param([0.0])], LocalTrainSettings(lr=lr, optimizer="adam", betas=(0.5, 0.6))
    )
    assert isinstance(opt, torch.optim.Adam) and opt.defaults["betas"] == (0.5, 0.6)


def test_fresh_adam_state_every_call_of_train_local():
    """Each call starts a new Adam: its first step moves every weight by ~lr (a carried
    state would make the second call's step differ)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    s = LocalTrainSettings(lr=1e-2, optimizer="adam", weight_decay=0.0)
    for _ in range(2):
        before = [p.detach().clone() for p in model.parameters()]
        train_local(model, lambda e: [(x, y)], [cross_entropy_term()], s, torch.device("cpu"))
        for b, p in zip(before, model.parameters()):
            moved = (p.detach() - b).abs()
            assert torch.allclose(moved, torch.full_like(moved, 1e-2), atol=1e-5)


def test_unknown_optimizer_in_make_optimizer():
    with pytest.raises(ValueError, match="sgd, adam, adamw"):
        make_optimizer([_param([0.0])], LocalTrainSettings(lr=0.1, optimizer="rmsprop"))


@pytest.mark.parametrize(
    "client,match",
    [
        ({"optimizer": "rmsprop"}, "'client.optimizer' must be one of sgd, adam, adamw"),
        ({"optimizer": "sgd", "nesterov": True, "momentum": 0.0}, "'client.nesterov' needs"),
        ({"optimizer": "adam", "nesterov": True, "momentum": 0.9}, "'client.nesterov' needs"),
        ({"optimizer": "adam", "betas": [0.9]}, "'client.betas' must be two numbers"),
        ({"optimizer": "adam", "betas": [0.9, 1.0]}, "'client.betas' must be two numbers"),
        ({"optimizer": "adamw", "eps": 0.0}, "'client.eps' must be in"),
    ],
)
def test_schema_rejects_bad_optimizer_settings(tiny, client, match):
    with pytest.raises(ConfigError, match=match):
        tiny(client=client)


def test_schema_accepts_the_paper_settings(tiny):
    cfg = tiny(client={"optimizer": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8})
    assert cfg.client.optimizer == "adam" and cfg.client.betas == [0.9, 0.999]
    cfg = tiny(client={"optimizer": "sgd", "momentum": 0.9, "nesterov": True})
    assert cfg.client.nesterov


OVERRIDES = {
    "feddyn": {"server": {"strategy": "feddyn"}},
    "fedproc": {"client": {"params": {"alpha": 0.5}}},
}


@pytest.mark.integration
@pytest.mark.parametrize("method", sorted(m for m in CLIENTS if m != "faulty"))
def test_every_method_trains_with_adam(tiny, tmp_path, method):
    over = OVERRIDES.get(method, {})
    cfg = tiny(
        client={
            "method": method,
            "optimizer": "adam",
            "lr": 1e-3,
            "weight_decay": 0.0,
            **over.get("client", {}),
        },
        server={"strategy": "fedavg", **over.get("server", {})},
        federation={"rounds": 1, "num_clients": 4, "clients_per_round": 2},
        evaluation={"target_rounds": [1]},
    )
    from fedrcl_flwr.run.runtime import initial_model, load_bundle

    w0 = [
        p.detach().numpy().copy()
        for p in initial_model(cfg, load_bundle(cfg)).state_dict().values()
    ]
    st = run_inprocess(cfg, tmp_path / "run")
    recs = read_metrics(tmp_path / "run")
    assert len(recs) == 1 and recs[0]["failures"] == 0 and recs[0]["num_clients"] == 2
    assert math.isfinite(recs[0]["train_loss"])
    assert all(np.all(np.isfinite(w)) for w in st.weights if w.dtype.kind == "f")
    assert any(not np.allclose(a, b) for a, b in zip(w0, st.weights) if a.dtype.kind == "f")
