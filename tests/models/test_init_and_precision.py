"""Model initialisation and mixed precision as the FedRCL authors ran.

* Table C: each backbone starts as the authors' ``models/`` start it: VGG9_base's
  ``normal(0, sqrt(2 / (k*k*C_out)))`` convolutions with zero bias (``init: model``), the
  other three PyTorch's default (``init: pytorch``); the YAMLs resolve to exactly that.
* ``client.amp: fp16`` is their ``use_amp`` (``clients/base_client.py: local_train``): a
  fresh ``GradScaler()`` (init scale 2^16, growth interval 2000) every client round, loss
  scaled, gradients unscaled before the norm clip, ``scaler.step`` / ``scaler.update``.
  Observed in-process without a GPU: the fp16 autocast is left out (no CUDA) and
  ``torch.amp.GradScaler`` is a recording subclass working on the CPU.
"""

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from fedrcl_flwr.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
TABLE_C = sorted((ROOT / "experiments" / "fedrcl").glob("tableC_*.yaml"))


def _initial(path):
    from fedrcl_flwr.run.runtime import new_model

    cfg = load_config(path)
    probe = type("B", (), {"num_classes": 100, "in_channels": 3, "image_size": 32})
    torch.manual_seed(0)
    return cfg, new_model(cfg, probe)


@pytest.mark.parametrize("path", TABLE_C, ids=lambda p: p.stem)
def test_table_c_models_start_as_the_authors_models(path):
    cfg, model = _initial(path)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs
    for conv in convs:
        k = conv.kernel_size[0] * conv.kernel_size[1]
        fan_in, n = conv.in_channels // conv.groups * k, k * conv.out_channels
        w = conv.weight.detach()
        if cfg.model.name == "vgg9_gn":
            # theirs: m.weight.data.normal_(0, math.sqrt(2. / n)); m.bias.data.zero_()
            assert float(w.std()) == pytest.approx(math.sqrt(2.0 / n), rel=0.06)
            assert float(w.mean()) == pytest.approx(
                0.0, abs=3 * math.sqrt(2.0 / n / w.numel()) + 1e-4
            )
            assert torch.count_nonzero(conv.bias) == 0
        else:
            # no init in their MobileNet / ShuffleNet / SqueezeNet: PyTorch's default,
            # kaiming_uniform(a=sqrt(5)) = U(±1/sqrt(fan_in))
            bound = 1.0 / math.sqrt(fan_in)
            assert float(w.abs().max()) <= bound + 1e-7
            if w.numel() >= 2000:
                assert float(w.std()) == pytest.approx(bound / math.sqrt(3), rel=0.06)
    if cfg.model.name == "vgg9_gn":
        # their classifier Linear layers keep PyTorch's default
        fc = model.fc1
        assert float(fc.weight.detach().abs().max()) <= 1 / math.sqrt(fc.in_features) + 1e-7
        assert cfg.model.init == "model"
    else:
        assert cfg.model.init == "pytorch"


@pytest.mark.integration
def test_fp16_is_a_fresh_grad_scaler_every_client_round(tiny, tmp_path, monkeypatch):
    import fedrcl_flwr.accel as accel
    from fedrcl_flwr.app.inprocess import run_inprocess

    created, scaled = [], []

    class Recording(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)
            self.start = (
                self._init_scale,
                self._growth_interval,
                self._growth_factor,
                self._backoff_factor,
            )

        def scale(self, outputs):
            scaled.append(id(self))
            return super().scale(outputs)

    real_dtype = accel.amp_dtype

    def cpu_fp16(mode, device):  # no CUDA here: the autocast is left out, the scaler kept
        return None if mode == "fp16" else real_dtype(mode, device)

    monkeypatch.setattr(accel, "amp_dtype", cpu_fp16)
    monkeypatch.setattr(torch.amp, "GradScaler", Recording)
    cfg = tiny(
        federation={"rounds": 2},
        model={"name": "cnn4"},
        client={"amp": "fp16", "device": "auto", "batch_size": 50},
    )
    run_inprocess(cfg, tmp_path / "run")
    # 2 rounds x 2 clients = 4 client rounds, one new scaler each, never reused
    assert len(created) == 4 and len({id(s) for s in created}) == 4
    assert all(s.start == (2.0**16, 2000, 2.0, 0.5) for s in created)  # GradScaler()
    # every step of a client round scaled its loss with that round's scaler
    per = [scaled.count(id(s)) for s in created]
    assert min(per) >= 2 and sum(per) == len(scaled)
    first = [scaled.index(id(s)) for s in created]
    assert first == sorted(first)  # a round's scaler is used only in that round


def test_fp16_without_cuda_is_refused_and_cpu_runs_stay_float32(tiny):
    import fedrcl_flwr.accel as accel

    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        accel.amp_dtype("fp16", "cpu")
    with pytest.raises(ConfigError, match="'client.amp' fp16 needs a CUDA device"):
        tiny(client={"amp": "fp16", "device": "cpu"})
    assert accel.amp_dtype("off", "cpu") is None and accel.grad_scaler("off", "cpu") is None
