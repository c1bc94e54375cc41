"""Server-side signal fidelity: FPL clusters with FINCH's early exit off (RethinkFL's
``proto_aggregation``), FedCCL's Table 7 "global averaged" ablation is Eq. 12's plain
average of the local signals."""

from __future__ import annotations

import numpy as np
import pytest

from fedrcl_flwr.app.server_app import make_exchange
from fedrcl_flwr.clustering import finch
from fedrcl_flwr.config import ConfigError
from fedrcl_flwr.server.signal_exchange import SignalExchange
from fedrcl_flwr.signals import SignalSet


def _differing_case():
    """Vectors whose last FINCH partition depends on the early exit."""
    for seed in range(200):
        v = np.random.default_rng(seed).normal(size=(14, 6)).astype(np.float32)
        on = finch(v, distance="cosine", ensure_early_exit=True)[0][:, -1]
        off = finch(v, distance="cosine", ensure_early_exit=False)[0][:, -1]
        if len(np.unique(on)) != len(np.unique(off)):
            return v, off
    raise AssertionError("no differing case found")


def _centres(v, assign):
    return sorted(tuple(np.round(v[assign == k].mean(0), 5)) for k in np.unique(assign))


def test_fpl_server_clusters_without_early_exit(tiny):
    v, off = _differing_case()
    local = SignalSet(v, np.zeros(len(v), np.int64), np.ones(len(v), np.int64))
    fpl = make_exchange(tiny(client={"method": "fpl"}), num_classes=4)
    assert fpl.p["finch_early_exit"] is False and fpl.p["global_mode"] == "finch_clusters"
    got = fpl.compute_global(local)
    assert sorted(tuple(np.round(x, 5)) for x in got.vectors) == _centres(v, off)
    # the early-exit variant really gives a different answer on these vectors
    on = SignalExchange({**fpl.p, "finch_early_exit": True}).compute_global(local)
    assert len(on) != len(got)
    # FedCCL keeps FINCH's default (early exit on)
    assert make_exchange(tiny(client={"method": "fedccl"}), 4).p["finch_early_exit"] is True


def test_fedccl_global_mean_ablation_is_a_plain_average(tiny):
    v = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0], [5.0, -1.0]], np.float32)
    labels = np.array([0, 0, 1, 1])
    counts = np.array([1, 9, 2, 6])
    local = SignalSet(v, labels, counts)
    cfg = tiny(client={"method": "fedccl", "params": {"global_signal": "mean"}})
    ex = make_exchange(cfg, num_classes=4)
    g = ex.compute_global(local)
    np.testing.assert_allclose(g.vectors, [[0.5, 0.5], [4.0, 1.0]], rtol=1e-6)  # Eq. 12
    # the count-weighted form stays available
    cfg = tiny(
        client={"method": "fedccl", "params": {"global_signal": "mean"}},
        server={"signals": {"mean_weighting": "samples"}},
    )
    g = make_exchange(cfg, num_classes=4).compute_global(local)
    np.testing.assert_allclose(g.vectors, [[0.1, 0.9], [4.5, 0.0]], rtol=1e-6)
    # FedProto keeps its count-weighted mean
    assert make_exchange(tiny(client={"method": "fedproto"}), 4).p["mean_weighting"] == "samples"


def test_bad_signal_options():
    with pytest.raises(ConfigError, match="mean_weighting"):
        SignalExchange({"mean_weighting": "median"})
    with pytest.raises(ConfigError, match="finch_early_exit"):
        SignalExchange({"finch_early_exit": "no"})
