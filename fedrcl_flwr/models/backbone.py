"""A (pre-trained) feature extractor followed by a two-layer MLP head, for the
inter-domain experiments of FedCCL (Qiao et al., 2024, Sec. 5.1: "a pre-trained Tiny-ViT
as the feature extractor layers, followed by a two-layer MLP with an input dimension of
192 and a hidden dimension of 128 for the decision-making layers").

The head is exactly two linear layers:

    x -> backbone -> b (the backbone's width; 192 for timm vit_tiny_patch16_224)
      -> mlp1: Linear(b, hidden=128) -> ReLU -> h      ("penultimate", alias "hidden")
      -> fc:   Linear(hidden, num_classes) -> logits

The 128-d ``h`` is the paper's "decision-making layer": it is what FedCCL (and FedProto,
FPL, FedProc, FedPCL) contrast and cluster, since every method reads
``feats["penultimate"]`` (the input of ``fc``). The paper's 192-d input is the width of
timm's ``vit_tiny_patch16_224`` (``backbone: vit_tiny``, what the inter-domain YAMLs use);
timm's TinyViT-5M (``tiny_vit_5m``) is 320-d and stays selectable.

It follows the project-wide model interface (see ``fedrcl_flwr.models``): ``model(x)`` ->
logits, ``model(x, return_features=True)`` -> ``(logits, feats)`` with the taps
``backbone`` and ``penultimate`` (``model.levels``, network order) plus ``hidden`` (the
same tensor as ``penultimate``, under the paper's name); ``model.feature_dim`` is
``hidden``.

Parameters (``model.params``):

* ``backbone`` — ``tiny_vit_5m`` (timm ``tiny_vit_5m_224``, 320-d features),
  ``vit_tiny`` (timm ``vit_tiny_patch16_224``, 192-d, the input width the paper states),
  ``timm:<name>`` (any timm model), or a torchvision classifier (``resnet18``,
  ``resnet34``, ``resnet50``, ``mobilenet_v2``, ``mobilenet_v3_small``,
  ``mobilenet_v3_large``, ``shufflenet_v2_x0_5``, ``shufflenet_v2_x1_0``,
  ``squeezenet1_0``, ``squeezenet1_1``). timm is optional and imported only when a timm
  backbone is asked for. Models are always created **without** downloading anything.
* ``weights`` — path of a local file holding the backbone's ``state_dict`` (e.g. saved
  with ``torch.save(timm.create_model("vit_tiny_patch16_224", pretrained=True)
  .state_dict(), path)`` on a machine with a network). Loaded with
  ``torch.load(weights_only=True)``; the original classifier's keys (``fc.``, ``head.``,
  ``classifier.`` that the headless backbone does not have) are ignored, any other
  mismatch is an error. ``null`` (default) keeps the random initialisation. A run never
  downloads: a missing file is an error naming what to fetch (:func:`weights_source`:
  the Hugging Face hub id for timm backbones, the download URL for torchvision ones) and
  the one-line command that saves it.
* ``freeze_backbone`` (default ``true``) — the backbone's parameters get
  ``requires_grad=False`` (so they are neither optimised nor weight-decayed, and travel
  unchanged) and the backbone stays in eval mode (BatchNorm statistics and dropout of a
  pre-trained network are not disturbed by local training). Gradients still flow through
  it to the *input*, so adversarial training (FedCCL+) works.
* ``hidden`` (128) — width of the MLP's hidden (decision-making) layer.

Single-channel inputs (MNIST-like) are repeated to three channels.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

TIMM_ALIASES = {"tiny_vit_5m": "tiny_vit_5m_224", "vit_tiny": "vit_tiny_patch16_224"}
TORCHVISION_BACKBONES = (
    "resnet18",
    "resnet34",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "mobilenet_v3_large",
    "shufflenet_v2_x0_5",
    "shufflenet_v2_x1_0",
    "squeezenet1_0",
    "squeezenet1_1",
)
# keys of the original classifier that a headless backbone does not have
_HEAD_PREFIXES = ("fc.", "head.", "classifier.")


def _timm_backbone(name: str, image_size: int) -> nn.Module:
    try:
        import timm
    except ImportError:
        raise ValueError(
            f"model.params.backbone {name!r} needs the 'timm' package, which "
            "is not installed: pip install timm"
        ) from None
    kwargs: dict[str, Any] = {"pretrained": False, "num_classes": 0}
    if name.startswith("vit_"):
        kwargs["img_size"] = image_size  # plain ViTs fix their position grid at creation
    try:
        return timm.create_model(name, **kwargs)
    except RuntimeError as exc:  # unknown model name
        raise ValueError(f"model.params.backbone: timm cannot create {name!r} ({exc})") from None


def _torchvision_backbone(name: str) -> nn.Module:
    import torchvision

    net = torchvision.models.get_model(name, weights=None)  # never downloads
    if isinstance(getattr(net, "fc", None), nn.Linear):  # resnet, shufflenet
        net.fc = nn.Identity()
    elif name.startswith("squeezenet"):  # classifier is dropout + 1x1 conv + pool
        net.classifier = nn.AdaptiveAvgPool2d(1)
    else:  # mobilenet: pooled features -> classifier
        net.classifier = nn.Identity()
    return net


def make_backbone(name: str, image_size: int) -> nn.Module:
    """A headless backbone returning ``(B, D)`` features (randomly initialised)."""
    if name in TIMM_ALIASES:
        return _timm_backbone(TIMM_ALIASES[name], image_size)
    if name.startswith("timm:"):
        return _timm_backbone(name[len("timm:") :], image_size)
    if name in TORCHVISION_BACKBONES:
        return _torchvision_backbone(name)
    known = sorted(TIMM_ALIASES) + list(TORCHVISION_BACKBONES) + ["timm:<name>"]
    raise ValueError(f"model.params.backbone must be one of {', '.join(known)}; got {name!r}")


def _unwrap_state_dict(obj, path: Path) -> dict:
    if isinstance(obj, dict):
        for key in ("state_dict", "model"):
            inner = obj.get(key)
            if (
                isinstance(inner, dict)
                and inner
                and all(isinstance(v, torch.Tensor) for v in inner.values())
            ):
                obj = inner
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(
            f"model.params.weights: {path} does not hold a state_dict "
            "(a mapping of parameter names to tensors)"
        )
    prefix = "module."
    if obj and all(k.startswith(prefix) for k in obj):
        obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return obj


def _resample_vit_pos_embed(state: dict, backbone: nn.Module) -> dict:
    """Adapt a ViT's absolute position embedding to this model's grid (timm helper)."""
    target = backbone.state_dict().get("pos_embed")
    given = state.get("pos_embed")
    if target is None or given is None or given.shape == target.shape:
        return state
    try:
        from timm.layers import resample_abs_pos_embed
    except ImportError:  # pragma: no cover - only reached with timm backbones
        return state
    prefix = getattr(backbone, "num_prefix_tokens", 1)
    patch_embed: Any = backbone.patch_embed  # a timm ViT's (has grid_size)
    grid = patch_embed.grid_size
    state = dict(state)
    state["pos_embed"] = resample_abs_pos_embed(
        given, new_size=list(grid), num_prefix_tokens=prefix
    )
    return state


def weights_source(name: str) -> tuple[str, str]:
    """``(where, command)`` for a backbone's pre-trained weights: the Hugging Face hub id
    (timm) or URL (torchvision) they come from, and a one-line command that saves them as
    ``<model>.pth`` on a machine with a network."""
    timm_name = TIMM_ALIASES.get(name, name[len("timm:") :] if name.startswith("timm:") else None)
    if timm_name is not None:
        where = f"timm model {timm_name!r}"
        try:
            import timm

            cfg = timm.models.get_pretrained_cfg(timm_name)
            if cfg is not None and cfg.hf_hub_id:
                where = f"Hugging Face hub {cfg.hf_hub_id}"
        except Exception:  # noqa: BLE001 - timm missing / unknown name: generic wording
            pass
        cmd = (
            f'python -c "import timm, torch; torch.save(timm.create_model('
            f"'{timm_name}', pretrained=True).state_dict(), '{timm_name}.pth')\""
        )
        return where, cmd
    where = f"torchvision {name} DEFAULT weights"
    try:
        import torchvision

        where = torchvision.models.get_model_weights(name).DEFAULT.url
    except Exception:  # noqa: BLE001 - no torchvision / no such weights: the generic name
        pass
    cmd = (
        f'python -c "import torch, torchvision; torch.save(torchvision.models.get_model('
        f"'{name}', weights='DEFAULT').state_dict(), '{name}.pth')\""
    )
    return where, cmd


def load_backbone_weights(backbone: nn.Module, weights: str, name: str = "") -> None:
    """Load a local state_dict into ``backbone`` (no download, ``weights_only``)."""
    path = Path(os.path.expanduser(str(weights)))
    if not path.is_file():
        hint = ""
        if name:
            where, cmd = weights_source(name)
            hint = (
                f"; a run never downloads: fetch the pre-trained weights ({where}) on a "
                f"machine with a network, e.g. {cmd}, and set model.params.weights to "
                "that file"
            )
        raise ValueError(
            f"model.params.weights: file not found: {path}{hint} (or "
            "weights: null for a random initialisation)"
        )
    from fedrcl_flwr.errors import CheckpointError
    from fedrcl_flwr.serialization import safe_load

    try:
        obj = safe_load(path, "state_dict")
    except CheckpointError as exc:  # any unreadable file is one clear error
        raise ValueError(f"model.params.weights: cannot read {path} ({exc})") from None
    state = _resample_vit_pos_embed(_unwrap_state_dict(obj, path), backbone)
    own = backbone.state_dict()
    unexpected = [k for k in state if k not in own]
    bad_unexpected = [k for k in unexpected if not k.startswith(_HEAD_PREFIXES)]
    missing = [k for k in own if k not in state]
    if missing or bad_unexpected:
        raise ValueError(
            f"model.params.weights: {path} does not match the backbone "
            f"(missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {bad_unexpected[:5]}"
            f"{'...' if len(bad_unexpected) > 5 else ''})"
        )
    wrong = [k for k in own if tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        k = wrong[0]
        raise ValueError(
            f"model.params.weights: {path}: '{k}' has shape "
            f"{tuple(state[k].shape)}, the backbone expects "
            f"{tuple(own[k].shape)} ({len(wrong)} mismatched tensor(s))"
        )
    backbone.load_state_dict({k: state[k] for k in own}, strict=True)


class BackboneMLP(nn.Module):
    """Feature extractor + two-layer MLP head ``mlp1`` -> ``fc`` (see module doc)."""

    levels = ("backbone", "penultimate")

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        image_size: int = 224,
        backbone: str = "tiny_vit_5m",
        weights: str | None = None,
        freeze_backbone: bool = True,
        hidden: int = 128,
    ):
        super().__init__()
        if in_channels not in (1, 3):
            raise ValueError(f"backbone_mlp takes 1- or 3-channel images, got {in_channels}")
        if int(hidden) < 1:
            raise ValueError(f"model.params.hidden must be >= 1, got {hidden}")
        self.in_channels = in_channels
        self.backbone_name = backbone
        self.backbone = make_backbone(str(backbone), int(image_size))
        if weights:
            load_backbone_weights(self.backbone, weights, str(backbone))
        with torch.no_grad():  # the backbone's feature width, from one probe
            was_training = self.backbone.training
            self.backbone.eval()
            probe = self.backbone(torch.zeros(1, 3, int(image_size), int(image_size)))
            self.backbone.train(was_training)
        self.backbone_dim = int(probe.flatten(1).shape[1])
        hidden = int(hidden)
        self.mlp1 = nn.Linear(self.backbone_dim, hidden)
        self.fc = nn.Linear(hidden, num_classes)
        self.feature_dim = hidden
        self.freeze_backbone = bool(freeze_backbone)
        if self.freeze_backbone:
            for p in self.backbone.parameters():
                p.requires_grad_(False)
            self.backbone.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        if self.freeze_backbone:
            self.backbone.eval()  # keep a frozen network's BN statistics / dropout fixed
        return self

    def forward(self, x: torch.Tensor, return_features: bool = False):
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)
        b = self.backbone(x).flatten(1)
        h = torch.relu(self.mlp1(b))
        logits = self.fc(h)
        if not return_features:
            return logits
        return logits, {"backbone": b, "penultimate": h, "hidden": h}
