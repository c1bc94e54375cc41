"""The authors' own models against their ports in the model registry: FedUV's SimpleCNN
(sonhamin/FedUV @ dd2e3c5 ``nets/models.py``) as ``feduv_simplecnn`` and FPL's ResNet-10
(WenkeHuang/RethinkFL @ 74201b3 ``backbone/ResNet.py: resnet10``) as ``resnet10_bn``.

The references are transliterations of their classes, written the way they wrote them
(their layer names, their order of construction, their forward). Nothing of the project
is imported for them. Checked: the parameter names and shapes map one to one (with the
documented renamings), the same ``torch.manual_seed`` draws the same initial weights, and
with one set of weights loaded into both the logits and features are bit for bit theirs,
in training mode (batch statistics, running statistics updated alike) and in eval mode.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fedrcl_flwr.models import build_model

pytestmark = pytest.mark.unit

# --------------------------------------------------------------- FedUV's SimpleCNN


class TheirSimpleCNN(nn.Module):
    """``nets/models.py: SimpleCNN(output_dim, n_classes, width)`` as they wrote it."""

    def __init__(self, output_dim=64, n_classes=10, width=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=3, out_channels=16 * width, kernel_size=3, bias=False)
        self.conv1_bn = nn.BatchNorm2d(16 * width)
        self.conv2 = nn.Conv2d(16 * width, 16 * width, 1, bias=False)
        self.conv2_bn = nn.BatchNorm2d(16 * width)
        self.relu = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(16 * width, 32 * width, 3, stride=2, bias=False)
        self.conv3_bn = nn.BatchNorm2d(32 * width)
        self.conv4 = nn.Conv2d(32 * width, 32 * width, 3, bias=False)
        self.conv4_bn = nn.BatchNorm2d(32 * width)
        self.conv5 = nn.Conv2d(32 * width, 32 * width, 1, bias=False)
        self.conv5_bn = nn.BatchNorm2d(32 * width)
        self.conv6 = nn.Conv2d(32 * width, 64 * width, 3, stride=2, bias=False)
        self.conv6_bn = nn.BatchNorm2d(64 * width)
        self.conv7 = nn.Conv2d(64 * width, 64 * width, 3, bias=False)
        self.conv7_bn = nn.BatchNorm2d(64 * width)
        self.conv8 = nn.Conv2d(64 * width, 64 * width, 1, bias=False)
        self.conv8_bn = nn.BatchNorm2d(64 * width)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc1 = nn.Linear(64 * width, output_dim)
        self.fc1_bn = nn.BatchNorm1d(output_dim)
        self.fc2 = nn.Linear(output_dim, output_dim)
        self.fc2_bn = nn.BatchNorm1d(output_dim)
        self.fc3 = nn.Linear(output_dim, n_classes)

    def forward(self, x):
        x = self.relu(self.conv1_bn(self.conv1(x)))
        x = self.relu(self.conv2_bn(self.conv2(x)))
        x = self.relu(self.conv3_bn(self.conv3(x)))
        x = self.relu(self.conv4_bn(self.conv4(x)))
        x = self.relu(self.conv5_bn(self.conv5(x)))
        x = self.relu(self.conv6_bn(self.conv6(x)))
        x = self.relu(self.conv7_bn(self.conv7(x)))
        x = self.relu(self.conv8_bn(self.conv8(x)))
        x = self.avgpool(x)
        x = x.view(-1, x.shape[1] * x.shape[2] * x.shape[3])
        x = self.fc1(x)
        x = self.fc1_bn(x)
        x = self.relu(x)
        x = self.fc2(x)
        x = self.fc2_bn(x)
        x = self.relu(x)
        y = self.fc3(x)
        return 0, x, y, 0, 0


def feduv_ours_name(theirs: str) -> str:
    """The one renaming: their classifier ``fc3`` is the interface's ``fc``."""
    return "fc." + theirs[len("fc3.") :] if theirs.startswith("fc3.") else theirs


def _ours_simplecnn(out_dim=256, width=1, num_classes=10, image_size=32):
    return build_model(
        "feduv_simplecnn",
        num_classes=num_classes,
        in_channels=3,
        image_size=image_size,
        params={"out_dim": out_dim, "width": width},
    )


@pytest.mark.parametrize("out_dim, width", [(256, 1), (32, 2)])
def test_feduv_simplecnn_names_shapes_and_initial_weights_are_theirs(out_dim, width):
    for seed in (0, 7):
        torch.manual_seed(seed)
        theirs = TheirSimpleCNN(out_dim, 10, width).state_dict()
        torch.manual_seed(seed)
        ours = _ours_simplecnn(out_dim, width).state_dict()
        assert sorted(ours) == sorted(feduv_ours_name(k) for k in theirs)
        for k, v in theirs.items():
            assert ours[feduv_ours_name(k)].shape == v.shape, k
            assert torch.equal(ours[feduv_ours_name(k)], v), (seed, k)
    # 8 convolutions, 10 BatchNorms (three buffers each), three linear layers
    assert sum(k.endswith("running_mean") for k in theirs) == 10
    assert sum(k.endswith(".bias") and k.startswith("fc") for k in theirs) == 3 + 2


def _randomised(model: nn.Module, seed: int) -> nn.Module:
    """Non-trivial BatchNorm affine parameters and running statistics (the defaults are
    ones / zeros, which would hide a swapped buffer)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    return model


def test_feduv_simplecnn_computes_their_logits_features_and_statistics():
    torch.manual_seed(3)
    theirs = _randomised(TheirSimpleCNN(256, 10, 1), 1)
    ours = build_model(
        "feduv_simplecnn", num_classes=10, in_channels=3, image_size=32, params={"out_dim": 256}
    )
    ours.load_state_dict({feduv_ours_name(k): v for k, v in theirs.state_dict().items()})
    x = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    for train in (True, False):
        theirs.train(train)
        ours.train(train)
        _, their_proj, their_logits, _, _ = theirs(x)
        logits, feats = ours(x, return_features=True)  # one forward each in training mode
        assert torch.equal(logits, their_logits)
        assert torch.equal(feats["penultimate"], their_proj)
        assert torch.equal(feats["projector"], their_proj)
        assert feats["encoder"].shape == (6, 64) and feats["conv2"].shape == (6, 16)
    assert torch.equal(ours(x), their_logits)  # eval mode: without the taps
    # training mode moved the running statistics the same way (one forward each)
    their_state = theirs.state_dict()
    for k, v in ours.state_dict().items():
        assert torch.equal(v, their_state["fc3" + k[2:]] if k.startswith("fc.") else their_state[k])


def test_feduv_simplecnn_one_sgd_step_equals_theirs():
    """The same loss on both (CE on the logits + a term on the projector output, as
    FedUV's), one SGD step with their optimiser settings: the same weights after it."""
    torch.manual_seed(4)
    theirs = TheirSimpleCNN(64, 10, 1)
    ours = _ours_simplecnn(out_dim=64)
    ours.load_state_dict({feduv_ours_name(k): v for k, v in theirs.state_dict().items()})
    x = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    y = torch.arange(8) % 10
    for net, out in ((theirs, lambda m: m(x)[2:0:-1]), (ours, None)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-5)
        if out is None:
            logits, feats = net(x, return_features=True)
            proj = feats["penultimate"]
        else:
            logits, proj = out(net)
        loss = F.cross_entropy(logits, y) + proj.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    their_state = theirs.state_dict()
    for k, v in ours.state_dict().items():
        assert torch.equal(v, their_state["fc3" + k[2:]] if k.startswith("fc.") else their_state[k])


def test_feduv_simplecnn_refuses_images_too_small_before_the_run(tmp_path, capsys):
    with pytest.raises(ValueError, match="at least 21x21"):
        _ours_simplecnn(image_size=20)
    assert _ours_simplecnn(image_size=21)(torch.randn(2, 3, 21, 21)).shape == (2, 10)
    from helpers import TINY, assert_run_refused  # 16 px synthetic images

    assert_run_refused(
        tmp_path, capsys, TINY, "model.name=feduv_simplecnn", "needs images of at least 21x21"
    )


# ---------------------------------------------------------------- FPL's ResNet-10


def their_conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class TheirBasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = their_conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = their_conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(
                    in_planes, self.expansion * planes, kernel_size=1, stride=stride, bias=False
                ),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        out = F.relu(out)
        return out


class TheirResNet(nn.Module):
    """``backbone/ResNet.py: ResNet`` as ``resnet10(nclasses, nf)`` builds it."""

    def __init__(self, block, num_blocks, num_classes, nf):
        super().__init__()
        self.in_planes = nf
        self.conv1 = their_conv3x3(3, nf * 1)
        self.bn1 = nn.BatchNorm2d(nf * 1)
        self.layer1 = self._make_layer(block, nf * 1, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, nf * 2, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, nf * 4, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(block, nf * 8, num_blocks[3], stride=2)
        self.linear = nn.Linear(nf * 8 * block.expansion, num_classes)
        self._features = nn.Sequential(
            self.conv1, self.bn1, nn.ReLU(), self.layer1, self.layer2, self.layer3, self.layer4
        )
        self.cls = self.linear
        self.encoder = nn.Sequential(
            nn.Linear(nf * 8 * block.expansion, nf * 8 * block.expansion),
            nn.ReLU(inplace=True),
            nn.Linear(nf * 8 * block.expansion, 512),
        )

    def _make_layer(self, block, planes, num_blocks, stride):
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def features(self, x):
        out = self._features(x)
        out = F.avg_pool2d(out, out.shape[2])
        return out.view(out.size(0), -1)

    def classifier(self, x):
        return self.cls(x)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer1(out)
        out = self.layer2(out)
        out = self.layer3(out)
        out = self.layer4(out)
        out = F.avg_pool2d(out, out.shape[2])
        feature = out.view(out.size(0), -1)
        return self.cls(feature)


def their_resnet10(nclasses, nf=64):
    return TheirResNet(TheirBasicBlock, [1, 1, 1, 1], nclasses, nf)


def resnet10_ours_name(theirs: str) -> str | None:
    """``linear.*`` is the interface's ``fc.*``; the unused ``encoder`` MLP (and the
    aliases ``_features.*`` / ``cls.*`` of modules already named) has no counterpart."""
    if theirs.startswith(("encoder.", "_features.", "cls.")):
        return None
    return "fc." + theirs[len("linear.") :] if theirs.startswith("linear.") else theirs


def _ours_resnet10(nf):
    return build_model(
        "resnet10_bn", num_classes=10, in_channels=3, image_size=32, params={"nf": nf}
    )


@pytest.mark.parametrize("nf", [4, 64])
def test_resnet10_bn_names_shapes_and_initial_weights_are_theirs(nf):
    for seed in (0, 5):
        torch.manual_seed(seed)
        theirs = their_resnet10(10, nf).state_dict()
        torch.manual_seed(seed)
        ours = _ours_resnet10(nf).state_dict()
        mapped = {resnet10_ours_name(k): v for k, v in theirs.items()}
        mapped.pop(None)
        assert sorted(ours) == sorted(mapped)
        for k, v in mapped.items():
            assert torch.equal(ours[k], v), (nf, seed, k)
    # the encoder is drawn after linear: nothing of ours is drawn after it
    assert any(k.startswith("encoder.") for k in theirs)


def test_resnet10_bn_computes_their_logits_and_fpl_features():
    torch.manual_seed(1)
    theirs = _randomised(their_resnet10(10, 8), 3)
    ours = _ours_resnet10(8)
    state = {resnet10_ours_name(k): v for k, v in theirs.state_dict().items()}
    state.pop(None)
    ours.load_state_dict(state)
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    for train in (True, False):
        theirs.train(train)
        ours.train(train)
        logits, feats = ours(x, return_features=True)  # one forward each in training mode
        f = theirs.features(x)  # FPL's prototype feature and its classifier input
        assert torch.equal(feats["penultimate"], f)
        assert torch.equal(theirs.classifier(f), logits)
    assert torch.equal(theirs(x), logits) and torch.equal(ours(x), logits)  # eval mode
    their_state = theirs.state_dict()
    for k, v in ours.state_dict().items():
        assert torch.equal(
            v, their_state["linear" + k[2:]] if k.startswith("fc.") else their_state[k]
        )
