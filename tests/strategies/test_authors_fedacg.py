"""The server rules of geehokim/FedACG @ 62b6e95 (FedRCL's baselines, skynbe/FedRCL's
``servers/base.py`` is the same file) against our strategies, on fixed tensors.

Transliterated here from their files: ``trainers/base_trainer.py: Trainer.train`` (the
round: the look-ahead model sent under ``server.FedACG``, ``local_deltas`` taken against
the model *sent*, ``server.aggregate(local_weights, local_deltas, ids, global_state_dict)``,
the result loaded as the new model), ``servers/base.py`` (``Server``: the uniform average;
``ServerM``: FedAvgM's ``avg + m·M_{t−1}`` then ``M_t = m·M_{t−1} + avg Δ``, FedACG's
``FedACG_lookahead`` and the same momentum without the extra term; ``ServerAdam``: ``v``
started at ``τ²``, no bias correction, ``trainer.global_lr``), ``configs/server/*.yaml``
(momentum 0.4 / 0.85, Adam 0.9 / 0.99 / τ 1e-3) and ``clients/base_client.py`` (FedACG's
client: ``client=ACG``, ``prox_loss`` weight 1e-3 on ``Σ (p − g)²`` over the named
parameters, ``g`` the model received). Their models use GroupNorm (``use_bn_layer:
False``), so every state entry is a parameter: the arrays here are all trainable.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from clients.base import FederatedClient
from strategies import strategy_class

# ------------------------------------------------------------- their code, transliterated


class _TheirServer:
    """``servers/base.py``: Server / ServerM / ServerAdam (``args`` as their YAMLs)."""

    def __init__(self, kind, momentum=-1.0, fedacg=False, beta=0.99, tau=1e-3, global_lr=1.0):
        self.kind, self.momentum, self.fedacg = kind, momentum, fedacg
        self.beta, self.tau, self.global_lr = beta, tau, global_lr

    def set_momentum(self, model):
        self.global_delta = {k: torch.zeros_like(v) for k, v in model.items()}
        self.global_momentum = {k: torch.zeros_like(v) for k, v in model.items()}
        if self.kind == "adam":
            self.global_v = {k: torch.zeros_like(v) + self.tau * self.tau for k, v in model.items()}

    def lookahead(self, model):
        sending = copy.deepcopy(model)
        for key in self.global_momentum:
            sending[key] += self.momentum * self.global_momentum[key]
        return sending

    def aggregate(self, local_weights, local_deltas, client_ids, model_dict):
        C = len(client_ids)
        if self.kind == "adam":
            for k in local_deltas:
                self.global_delta[k] = sum(local_deltas[k]) / C
                self.global_momentum[k] = (
                    self.momentum * self.global_momentum[k]
                    + (1 - self.momentum) * self.global_delta[k]
                )
                self.global_v[k] = self.beta * self.global_v[k] + (1 - self.beta) * (
                    self.global_delta[k] * self.global_delta[k]
                )
            for k in model_dict:
                model_dict[k] += (
                    self.global_lr
                    * self.global_momentum[k]
                    / ((self.global_v[k] ** 0.5) + self.tau)
                )
            return model_dict
        for k in local_weights:
            local_weights[k] = sum(local_weights[k]) / C
        if self.kind == "m" and self.momentum > 0:
            if not self.fedacg:
                for k in local_weights:
                    local_weights[k] += self.momentum * self.global_momentum[k]
            for k in local_deltas:
                self.global_delta[k] = sum(local_deltas[k]) / C
                self.global_momentum[k] = (
                    self.momentum * self.global_momentum[k] + (self.global_delta[k])
                )
        return local_weights


def _their_round(server, model, client_models):
    """One ``Trainer.train`` round; ``client_models(sent)`` plays the clients."""
    global_state_dict = copy.deepcopy(model)
    if server.fedacg:
        model = server.lookahead(copy.deepcopy(model))
        global_state_dict = copy.deepcopy(model)
    local_weights, local_deltas = {k: [] for k in model}, {k: [] for k in model}
    locals_ = client_models(model)
    for sd in locals_:
        for k in sd:
            local_weights[k].append(sd[k])
            local_deltas[k].append(sd[k] - global_state_dict[k])
    new = server.aggregate(
        local_weights, local_deltas, list(range(len(locals_))), copy.deepcopy(global_state_dict)
    )
    return model, new  # (what the clients received, the new global model)


# ------------------------------------------------------------------- ours, on the same


class _P:
    cid = "x"


class _Mgr:
    p = {str(i): _P() for i in range(4)}

    def wait_for(self, n, timeout=0):
        return True

    def all(self):
        return self.p


def _fit(arrays, pid):
    params = ndarrays_to_parameters(arrays)
    return (_P(), FitRes(Status(Code.OK, ""), params, 10, {"partition_id": pid}))


SHAPES = {"conv.weight": (3, 2, 3, 3), "gn.weight": (3,), "fc.weight": (4, 5), "fc.bias": (4,)}


def _rounds(name, params, their_server, w0, moves):
    """Both servers driven round by round on the same client moves (``moves[r][i]``: client
    i's fixed move from what it received in round r); yields, per round, ``(sent_ours,
    sent_theirs, new_ours, new_theirs, ours)`` with ours as arrays in ``SHAPES`` order."""
    keys, clients = list(SHAPES), len(moves[0])
    ours = strategy_class(name)(
        initial_weights=[w0[k].numpy().copy() for k in keys],
        trainable=[True] * len(keys),
        num_clients=4,
        clients_per_round=clients,
        rounds=len(moves),
        params=params,
    )
    their_server.set_momentum(w0)
    model = copy.deepcopy(w0)
    for r, mv in enumerate(moves):
        sent_theirs, model = _their_round(
            their_server, model, lambda sent, mv=mv: [{k: sent[k] + m[k] for k in sent} for m in mv]
        )
        ins = ours.configure_fit(r + 1, None, _Mgr())
        sent_ours = parameters_to_ndarrays(ins[0][1].parameters)
        results = [
            _fit([sent_ours[j] + mv[i][k].numpy() for j, k in enumerate(keys)], i)
            for i in range(clients)
        ]
        out, _ = ours.aggregate_fit(r + 1, results, [])
        yield sent_ours, sent_theirs, parameters_to_ndarrays(out), model, ours


def _moves(g, rounds, clients, dtype):
    """Each client's update: a fixed random move from what it received (step sizes vary)."""
    return [
        [
            {k: 0.1 * (r + 1) * torch.randn(s, generator=g, dtype=dtype) for k, s in SHAPES.items()}
            for _ in range(clients)
        ]
        for r in range(rounds)
    ]


def _run_both(name, params, their_server, rounds=4, clients=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    w0 = {k: torch.randn(s, generator=g, dtype=torch.float64) for k, s in SHAPES.items()}
    moves = _moves(g, rounds, clients, torch.float64)
    keys = list(SHAPES)
    model = w0
    for sent_ours, sent_theirs, new_ours, model, _ in _rounds(
        name, params, their_server, w0, moves
    ):
        for j, k in enumerate(keys):
            np.testing.assert_allclose(sent_ours[j], sent_theirs[k].numpy(), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(new_ours[j], model[k].numpy(), rtol=1e-10, atol=1e-12)
    return model, w0


# -------------------------------------------------------------------------------- tests


def test_fedavg_is_their_server_uniform_average():
    _run_both("fedavg", {}, _TheirServer("base"))


def test_fedavgm_is_their_serverm_with_momentum_0_4():
    final, w0 = _run_both("fedavgm", {}, _TheirServer("m", momentum=0.4))  # our defaults
    # the momentum moved it: not the plain average of the last round
    assert any(not torch.allclose(final[k], w0[k]) for k in final)


def test_fedadam_is_their_server_adam_tau_sq_start_no_bias_correction():
    # our defaults: server_lr 0.01 (their README's trainer.global_lr=0.01), β 0.9 / 0.99,
    # τ 1e-3, v₀ = τ²
    _run_both("fedadam", {}, _TheirServer("adam", momentum=0.9, global_lr=0.01))


@pytest.mark.parametrize("seed", [0, 1])
def test_fedacg_lookahead_and_momentum_are_theirs(seed):
    # our defaults: λ 0.85 (their configs/server/FedACG.yaml momentum), β 1e-3
    _run_both("fedacg", {}, _TheirServer("m", momentum=0.85, fedacg=True), seed=seed)


def test_fedacg_client_term_is_their_prox_loss_on_the_received_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.GroupNorm(2, 4))
    received = [p.detach() + 0.3 * torch.randn_like(p) for p in model.parameters()]
    # theirs: weights["prox"] = 1e-3 (configs/client/ACG.yaml);
    # prox_loss = Σ ((p − fixed_params[n].detach()) ** 2).sum() over named_parameters
    their = 1e-3 * sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), received))
    fake = SimpleNamespace(received_trainable=lambda: received)
    term = FederatedClient.distance_to_received_term(fake, "acg", 1e-3)
    ours = term.weight * term.fn(SimpleNamespace(model=model))
    torch.testing.assert_close(ours, their, rtol=1e-6, atol=0)
    their.backward()
    g_theirs = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (term.weight * term.fn(SimpleNamespace(model=model))).backward()
    for a, b in zip(model.parameters(), g_theirs):
        torch.testing.assert_close(a.grad, b)
    assert strategy_class("fedacg").defaults["beta"] == 1e-3


def test_beta_zero_is_fedrcls_code_path():
    # skynbe/FedRCL's FedACG runs (server=FedACG with client=base) add no client term:
    # server.params.beta=0 sends acg_beta 0
    st = strategy_class("fedacg")(
        initial_weights=[np.zeros(2)],
        trainable=[True],
        num_clients=4,
        clients_per_round=2,
        rounds=1,
        params={"beta": 0.0},
    )
    assert st.client_params(1).acg_beta == 0.0


def test_fedacg_float32_arithmetic_is_theirs_bit_for_bit():
    """``arithmetic: float32``: their server's float32 order (look-ahead, each client's
    delta against it, ``sum / C`` of the deltas and of the models, the momentum), on three
    clients over four rounds: what the clients receive, the new model and the momentum
    equal theirs to the bit. The default (float64) differs from theirs by rounding only."""
    g = torch.Generator().manual_seed(3)
    keys = list(SHAPES)
    w0 = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}  # float32
    moves = _moves(g, 4, 3, torch.float32)

    def run(arithmetic):
        theirs, exact = _TheirServer("m", momentum=0.85, fedacg=True), True
        params = {"arithmetic": arithmetic}
        for sent_ours, sent_theirs, new_ours, model, ours in _rounds(
            "fedacg", params, theirs, w0, moves
        ):
            for j, k in enumerate(keys):
                assert new_ours[j].dtype == np.float32
                same = (
                    np.array_equal(sent_ours[j], sent_theirs[k].numpy())
                    and np.array_equal(new_ours[j], model[k].numpy())
                    and np.array_equal(ours.m_buf[j], theirs.global_momentum[k].numpy())
                )
                exact = exact and same
                if arithmetic == "float64":  # the same formulas: equal to rounding
                    np.testing.assert_allclose(new_ours[j], model[k].numpy(), rtol=1e-5, atol=1e-6)
        return exact

    assert run("float32")
    assert not run("float64")  # the default rounds otherwise (so the check can fail)
