"""Classifier alignment: SLCA's second half (Zhang et al., "SLCA: Slow Learner with Classifier
Alignment for Continual Learning on a Pre-trained Model", ICCV 2023), in plain PyTorch.

After each experience, every class ``c`` seen so far is modelled by a Gaussian ``N(μ_c, Σ_c)`` of
the features the head reads (the head's input), measured once, on the experience that brought the
class, with the backbone of that time. The head is then re-trained on features sampled from all the
Gaussians, ``n`` per class, with cross-entropy on logit-normalised outputs (Wei et al. 2022):

``loss = CE(z / (τ · ‖z‖₂), y)``,  ``z = head(f)``,  ``f ~ N(μ_y, Σ_y + ρ · tr(Σ_y)/d · I)``

(``ρ``: a relative ridge, since ``Σ_y`` of a few hundred samples of a 1,280-wide feature is
singular; ``τ = None``: plain cross-entropy). SLCA samples 256 features per class and trains the
head for 5 epochs by SGD; those are the defaults of
:class:`~avalanche_plugins.layer_adaptive.alignment_plugin.ClassifierAlignmentPlugin`.
"""

from __future__ import annotations

import torch
from torch import nn

from avalanche_plugins.core.checks import check_finite, check_int, check_positive

__all__ = ["ClassStatistics", "class_statistics", "sample_features", "align_head"]


class ClassStatistics:
    """Per-class feature means ``(C, d)``, covariance Cholesky factors ``(C, d, d)`` and class ids ``(C,)``.

    Example:
        >>> stats = class_statistics(torch.randn(40, 3), torch.arange(40) % 2)
        >>> stats.classes.tolist(), tuple(stats.means.shape), tuple(stats.cholesky.shape)
        ([0, 1], (2, 3), (2, 3, 3))
    """

    def __init__(self, classes: torch.Tensor, means: torch.Tensor, cholesky: torch.Tensor):
        self.classes, self.means, self.cholesky = classes, means, cholesky

    def merged(self, newer: ClassStatistics) -> ClassStatistics:
        """These statistics with ``newer``'s classes added; a class in both keeps ``newer``'s."""
        keep = ~torch.isin(self.classes, newer.classes)
        return ClassStatistics(torch.cat([self.classes[keep], newer.classes]),
                               torch.cat([self.means[keep], newer.means]),
                               torch.cat([self.cholesky[keep], newer.cholesky]))

    def __len__(self) -> int:
        return len(self.classes)


def class_statistics(features: torch.Tensor, labels: torch.Tensor, ridge: float = 1e-4) -> ClassStatistics:
    """Mean and covariance of ``features`` ``(n, d)`` per class of ``labels``, the covariance as
    the Cholesky factor of ``Σ_c + ridge · tr(Σ_c)/d · I`` (``Σ_c`` unbiased; a one-sample class
    gets the ridge of the whole batch's covariance).

    Example:
        >>> f = torch.tensor([[0., 0.], [2., 0.], [0., 4.], [0., 6.]])
        >>> s = class_statistics(f, torch.tensor([0, 0, 1, 1]), ridge=0.0)
        >>> s.means.tolist()
        [[1.0, 0.0], [0.0, 5.0]]
        >>> [round(v, 6) for v in (s.cholesky[0] @ s.cholesky[0].T).diagonal().tolist()]  # 2 along x, ~0 along y
        [2.0, 0.0]
    """
    check_finite("features", features)
    check_positive("ridge", ridge, allow_zero=True)
    if features.dim() != 2 or len(features) != len(labels):
        raise ValueError(f"features must be (n, d) with one label each, got {tuple(features.shape)} and "
                         f"{len(labels)} labels")
    features = features.double()
    classes = labels.unique()
    # one class at a time (an experience brings a few): centring first keeps the covariance exact in
    # double precision, and memory stays at one class's (n_c, d) instead of (n, C, d)
    means, cov = [], []
    for c in classes:
        own = features[labels == c]
        means.append(own.mean(0))
        centred = own - means[-1]
        cov.append(centred.T @ centred / max(len(own) - 1, 1))
    means, cov = torch.stack(means), torch.stack(cov)
    d = features.shape[1]
    scale = cov.diagonal(dim1=1, dim2=2).sum(-1) / d
    scale = torch.where(scale > 0, scale, features.var(0, unbiased=False).mean().clamp_min(1e-12))
    eye = torch.eye(d, dtype=cov.dtype, device=cov.device)
    jitter = max(ridge, 1e-10)  # Σ_c is singular below d samples: never factor it without a floor
    chol = torch.linalg.cholesky(cov + jitter * scale[:, None, None] * eye)
    return ClassStatistics(classes, means.float(), chol.float())


def sample_features(stats: ClassStatistics, n_per_class: int, generator: torch.Generator | None = None):
    """``n_per_class`` features of every class of ``stats`` drawn from its Gaussian: ``(features, labels)``.

    Example:
        >>> s = class_statistics(torch.randn(30, 4), torch.arange(30) % 3)
        >>> f, y = sample_features(s, 5, torch.Generator().manual_seed(0))
        >>> tuple(f.shape), y.bincount().tolist()
        ((15, 4), [5, 5, 5])
    """
    check_int("n_per_class", n_per_class)
    c, d = stats.means.shape
    noise = torch.randn((c, n_per_class, d), generator=generator, dtype=stats.means.dtype).to(stats.means.device)
    features = stats.means[:, None, :] + noise @ stats.cholesky.transpose(1, 2)
    labels = stats.classes[:, None].expand(c, n_per_class)
    return features.reshape(c * n_per_class, d), labels.reshape(-1)


def _logit_normalised_loss(logits: torch.Tensor, labels: torch.Tensor, temperature: float | None) -> torch.Tensor:
    if temperature is not None:
        logits = logits / (temperature * logits.norm(dim=1, keepdim=True).clamp_min(1e-7))
    return nn.functional.cross_entropy(logits, labels)


def align_head(head: nn.Module, stats: ClassStatistics, *, n_per_class: int = 256, epochs: int = 5,
               lr: float = 0.01, momentum: float = 0.9, batch_size: int = 64, temperature: float | None = 0.1,
               seed: int = 0) -> list[float]:
    """Re-train ``head`` in place on features sampled from ``stats`` (module docstring): ``epochs``
    passes of SGD over ``n_per_class`` samples per class in shuffled minibatches. Returns the mean
    loss of every epoch.

    Example:
        >>> torch.manual_seed(0) is not None
        True
        >>> f = torch.cat([torch.randn(50, 2) + 3, torch.randn(50, 2) - 3])
        >>> y = torch.arange(100) // 50
        >>> head = nn.Linear(2, 2)
        >>> losses = align_head(head, class_statistics(f, y), n_per_class=64, epochs=3)
        >>> (head(f).argmax(1) == y).float().mean().item()
        1.0
    """
    check_int("epochs", epochs)
    check_int("batch_size", batch_size)
    check_positive("lr", lr)
    if temperature is not None:
        check_positive("temperature", temperature)
    generator = torch.Generator().manual_seed(seed)
    features, labels = sample_features(stats, n_per_class, generator)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum)
    losses = []
    with torch.enable_grad():
        for _ in range(epochs):
            order = torch.randperm(len(labels), generator=generator).to(labels.device)
            total = 0.0
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                loss = _logit_normalised_loss(head(features[idx]), labels[idx], temperature)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(idx)
            losses.append(total / len(order))
    return losses
