"""FedCCL's open-choice parameters (clients/fedccl.py): ``reduction``, ``finch_early_exit``,
``feature``, ``signal_level``, each checked on a small exact case through the client's own
loss terms and signal upload (no Flower, no training)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from clients.fedccl import FedCCLClient
from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.protocol import FitReport
from fedrcl_flwr.signals import decode_signals


def _client(tiny, **params):
    cfg = tiny(client={"method": "fedccl", "params": params})
    c = FedCCLClient.__new__(FedCCLClient)  # the hooks only, no model or data
    c.cfg, c.p, c.device = cfg, FedCCLClient.resolve(cfg), torch.device("cpu")
    return c


def _by_hand(f, y, sv, sl, tau):
    """−log(Σ_pos e^{cos/τ} / Σ_all e^{cos/τ}) per sample (NaN without a positive)."""
    out = []
    for fi, yi in zip(f, y):
        cos = [float(np.dot(fi, s) / np.linalg.norm(fi) / np.linalg.norm(s)) for s in sv]
        pos = [math.exp(c / tau) for c, lab in zip(cos, sl) if lab == yi]
        allv = sum(math.exp(c / tau) for c in cos)
        out.append(-math.log(sum(pos) / allv) if pos else float("nan"))
    return np.array(out)


F = np.array([[1.0, 0.2], [0.3, 0.9], [-0.5, 0.4], [0.7, -0.7]])
Y = np.array([0, 1, 1, 4])  # class 4 has no signal
SV = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
SL = np.array([0, 0, 1])
GV = np.array([[1.0, 0.1], [0.1, 1.0]])
GL = np.array([0, 1])


def _terms(client):
    client.local_signals = (torch.tensor(SV), torch.tensor(SL))
    client.global_signals = (torch.tensor(GV), torch.tensor(GL))
    batch = SimpleNamespace(feats={"penultimate": torch.tensor(F)}, y=torch.tensor(Y))
    return {t.name: (t.fn(batch).item(), t.weight) for t in client.loss_terms() if t.name != "ce"}


@pytest.mark.parametrize("tau", [0.07, 0.5])
def test_reduction_mean_and_sum_against_hand_values(tiny, tau):
    local = _by_hand(F, Y, SV, SL, tau)
    glob = _by_hand(F, Y, GV, GL, tau)
    valid = ~np.isnan(local)
    assert valid.tolist() == [True, True, True, False]

    mean = _terms(_client(tiny, tau=tau))
    assert mean["local"][0] == pytest.approx(local[valid].mean(), rel=1e-9)
    assert mean["global"][0] == pytest.approx(glob[valid].mean(), rel=1e-9)
    assert mean["local"][1] == mean["global"][1] == 1.0  # Eq. 18: weight 1 each

    summed = _terms(_client(tiny, tau=tau, reduction="sum", w_local=0.5))
    assert summed["local"][0] == pytest.approx(local[valid].sum(), rel=1e-9)
    assert summed["global"][0] == pytest.approx(glob[valid].sum(), rel=1e-9)
    assert summed["local"][1] == 0.5


def _unit(deg):
    return [math.cos(math.radians(deg)), math.sin(math.radians(deg))]


# two groups of two tight pairs (see tests/losses/test_fedccl.py for why FINCH's early
# exit keeps the pairs and the paper's recursion merges them into the groups)
PTS = np.array([_unit(d) for d in (0, 0.5, 10, 10.5, 60, 60.5, 70, 70.5)], np.float32)


def _uploaded(client, monkeypatch, feats, labels):
    monkeypatch.setattr(client, "embed_local_data", lambda: (feats, labels), raising=False)
    client.local_signals = client.global_signals = None
    report = FitReport()
    client.on_round_end(report)
    return decode_signals(report.signals)


@pytest.mark.parametrize(
    "params, groups",
    [
        ({}, [[0, 1], [2, 3], [4, 5], [6, 7]]),  # coarsest with early exit: the pairs
        ({"finch_early_exit": False}, [[0, 1, 2, 3], [4, 5, 6, 7]]),  # the recursion
        ({"finch_early_exit": False, "signal_level": "finest"}, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        ({"finch_early_exit": False, "signal_level": "0"}, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        ({"finch_early_exit": False, "local_signal": "mean"}, [list(range(8))]),
    ],
)
def test_uploaded_signals_follow_level_and_early_exit(tiny, monkeypatch, params, groups):
    client = _client(tiny, **params)
    s = _uploaded(client, monkeypatch, PTS, np.full(8, 2))
    np.testing.assert_allclose(s.vectors, [PTS[g].mean(0) for g in groups], rtol=1e-6)
    np.testing.assert_array_equal(s.counts, [len(g) for g in groups])
    np.testing.assert_array_equal(s.labels, [2] * len(groups))


def test_feature_selects_the_contrasted_tap(tiny):
    client = _client(tiny, feature="conv1")
    client.local_signals = (torch.tensor(SV), torch.tensor(SL))
    client.global_signals = None
    ones = torch.ones(4, 2, dtype=torch.float64)
    batch = SimpleNamespace(
        feats={"penultimate": ones, "conv1": torch.tensor(F)}, y=torch.tensor(Y)
    )
    (local,) = [t for t in client.loss_terms() if t.name == "local"]
    expect = _by_hand(F, Y, SV, SL, 0.07)
    assert local.fn(batch).item() == pytest.approx(np.nanmean(expect), rel=1e-9)


@pytest.mark.parametrize(
    "params, words",
    [
        ({"reduction": "total"}, "reduction"),
        ({"finch_early_exit": "yes"}, "finch_early_exit"),
        ({"signal_level": "middle"}, "signal_level"),
    ],
)
def test_bad_values_are_one_config_error(tiny, params, words):
    cfg = tiny(client={"method": "fedccl", "params": params})
    with pytest.raises(ConfigError, match=words):
        FedCCLClient.resolve(cfg)
