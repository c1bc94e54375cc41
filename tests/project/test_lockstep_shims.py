"""The FedUV and RethinkFL sides of ``benchmarks/fidelity/lockstep.py``, without the
authors' code: the state-dict name maps between their models and ours (sonhamin/FedUV @
dd2e3c5 ``nets/models.py``: the classifier is ``fc3``; WenkeHuang/RethinkFL @ 74201b3
``backbone/ResNet.py``: the classifier is ``linear``, and ``_features`` / ``cls`` name
modules listed already), the checkout check, the experiment each side's ours runs (a valid
config with their arithmetic and their loader) and FPL's ``np.array`` shim."""

import argparse
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "fidelity"))

import lockstep_feduv as feduv  # noqa: E402
import lockstep_rethinkfl as rethinkfl  # noqa: E402

from fedrcl_flwr.config import config_from_dict  # noqa: E402
from fedrcl_flwr.models import build_model  # noqa: E402

pytestmark = pytest.mark.unit


def _args(side, **kw):
    return argparse.Namespace(**{**side.DEFAULTS, "method": side.METHODS[0], "augment": "on", **kw})


def _state_names(name, **params):
    model = build_model(name, num_classes=10, in_channels=3, image_size=32, params=params)
    return list(model.state_dict())


def test_feduv_names_map_both_ways_and_only_the_classifier_moves():
    names = _state_names("feduv_simplecnn", out_dim=256)
    moved = {n: feduv.ours_to_theirs(n) for n in names if feduv.ours_to_theirs(n) != n}
    assert moved and all(n.startswith("fc.") and t.startswith("fc3.") for n, t in moved.items())
    assert [feduv.theirs_to_ours(feduv.ours_to_theirs(n)) for n in names] == names


def test_rethinkfl_names_map_both_ways_and_second_names_are_left_out():
    names = _state_names("resnet10_bn", nf=rethinkfl.NF)
    assert [rethinkfl.theirs_to_ours(rethinkfl.ours_to_theirs(n)) for n in names] == names
    assert rethinkfl.ours_to_theirs("fc.weight") == "linear.weight"
    for second in ("_features.0.weight", "cls.bias", "encoder.0.weight"):
        assert rethinkfl.theirs_to_ours(second) is None


@pytest.mark.parametrize("side", [feduv, rethinkfl], ids=lambda s: s.NAME)
def test_a_checkout_without_their_files_is_named(side, tmp_path):
    problem = side.checkout_problem(tmp_path)
    assert problem is not None and problem.startswith("no ")
    missing = problem.split()[1]
    (tmp_path / missing).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / missing).write_text("")
    assert side.checkout_problem(tmp_path) != problem  # the next missing file, or none


@pytest.mark.parametrize("method", feduv.METHODS)
@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_feduv_experiment_is_valid_with_their_loader_and_arithmetic(method, alpha, tmp_path):
    data = feduv.our_experiment(_args(feduv, method=method, alpha=alpha), tmp_path, tmp_path)
    cfg = config_from_dict(data)
    assert cfg.server.average_dtype == "float32" and cfg.client.drop_last is True
    assert cfg.client.grad_clip is None  # their fedavg / feduv clients do not clip
    assert cfg.client.method == ("univarfl" if method == "feduv" else "fedavg")
    assert cfg.partition.generator == "feduv"
    assert cfg.partition.scheme == ("iid" if alpha == 0 else "dirichlet")


@pytest.mark.parametrize("method", rethinkfl.METHODS)
@pytest.mark.parametrize("augment", ["on", "off"])
def test_rethinkfl_experiment_is_valid_at_their_width(method, augment, tmp_path):
    a = _args(rethinkfl, method=method, augment=augment)
    cfg = config_from_dict(rethinkfl.our_experiment(a, tmp_path, tmp_path))
    assert cfg.model.params == {"nf": rethinkfl.NF} and cfg.client.lr_decay == 1.0
    assert cfg.dataset.domains == rethinkfl.DOMAINS and cfg.partition.scheme == "domain"
    assert cfg.client.method == method
    # their _train_net never clips the gradient; FPL's contrast exceeds our default 10
    assert cfg.client.grad_clip is None
    if method == "fpl":  # their loop, their order, their mean over the batch
        assert cfg.client.params["variant"] == "official"
        assert cfg.client.params["mean_over"] == "batch"


def test_fpl_numpy_keeps_a_list_of_tensors_as_an_object_array():
    shim = rethinkfl._numpy_for_fpl(np)
    tensors = [torch.zeros(3), torch.ones(2)]
    out = shim.array(tensors)
    assert out.dtype == object and out.shape == (2,)
    assert out[0] is tensors[0] and out[1] is tensors[1]  # the same tensors, not copies
    assert np.array_equal(shim.array([1, 2, 3]), np.array([1, 2, 3]))
    assert shim.unique is np.unique and shim.concatenate is np.concatenate
