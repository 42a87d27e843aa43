"""Small adapters between Avalanche strategies and the plain-torch estimators."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from avalanche_plugins.core.layers import discover_layers, example_input
from avalanche_plugins.core.parallel import unwrap_model

__all__ = ["WHOLE_READ_LIMIT", "TransientCache", "dataset_subset", "experience_tensors", "experience_batches", "experience_example",
           "experience_layer_map", "metric_name", "preserved_rng"]


def experience_batches(strategy, *, dataset=None, batch_size=None, num_workers: int = 0,
                       preserve_rng: bool = True):
    """Minibatches ``(x, y, task_labels)`` of the current experience's dataset on the strategy's
    device, non-shuffled, exactly as Avalanche's ``EWCPlugin`` builds them.

    Creating a DataLoader iterator draws one number from torch's global RNG even without
    shuffling; ``preserve_rng=True`` restores the RNG afterwards so measuring never changes the
    training run's random stream. ``False`` mimics Avalanche's own plugins (one draw).
    """
    data = strategy.experience.dataset if dataset is None else dataset
    loader = DataLoader(data, batch_size=batch_size or strategy.train_mb_size,
                        collate_fn=getattr(data, "collate_fn", None), num_workers=num_workers)
    state = torch.get_rng_state() if preserve_rng else None
    try:
        for batch in loader:
            yield batch[0].to(strategy.device), batch[1].to(strategy.device), batch[-1]
    finally:
        if state is not None:
            torch.set_rng_state(state)


def dataset_subset(data, indices):
    """The samples ``indices`` of ``data``: Avalanche's ``subset`` (keeping its transforms and
    collate function) for an Avalanche dataset, ``torch.utils.data.Subset`` for any other."""
    return data.subset(indices) if hasattr(data, "subset") else torch.utils.data.Subset(data, indices)


_READS = "_avalanche_plugins_experience_reads"  # the strategy's last reads: [(dataset, key, tensors)]


class TransientCache(dict):
    """A dict that pickles empty: what a component keeps only to avoid reading data twice stays
    out of checkpoints (a pickled strategy or metric).

    >>> import pickle
    >>> cache = TransientCache(a=1)
    >>> pickle.loads(pickle.dumps(cache)), cache["a"]
    ({}, 1)
    """

    def __reduce__(self):
        return type(self), ()


#: an experience of at most this many samples is read whole once and every component's samples
#: are taken from that copy (digits' and the MNIST subset's experiences: a few hundred to 1,600)
WHOLE_READ_LIMIT = 2048


def experience_tensors(strategy, *, n_samples: int | None = None, seed: int = 0, eval_transforms: bool = True):
    """Up to ``n_samples`` random samples of the current experience as ``(x, y, task_labels)`` tensors.

    With ``eval_transforms`` reads are kept on the strategy (never in a checkpoint): an experience
    of at most :data:`WHOLE_READ_LIMIT` samples is read whole, once, and every component's samples
    are index selections of that copy; of a larger one the last two reads are kept, so a component
    asking for the same samples of the same experience's dataset (same ``n_samples`` and ``seed``;
    the layer-sensitivity metric and ADS both take 128 samples with seed ``e`` at experience ``e``)
    gets copies of them. Reading through Avalanche's per-sample indexing costs about as much as a
    small model's estimator (issue 41). Evaluation transforms run once per kept sample: a random
    evaluation transform is drawn once for every component.
    """
    source = strategy.experience.dataset
    data = source.eval() if eval_transforms and hasattr(source, "eval") else source
    n = len(data)
    if n == 0:
        raise ValueError("the experience's dataset is empty")
    idx = None
    if n_samples is not None and n_samples < n:
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(n, generator=g)[:n_samples].sort().values.tolist()
    whole = eval_transforms and n <= WHOLE_READ_LIMIT
    key = (n, None if idx is None or whole else tuple(idx), str(strategy.device))
    cache = strategy.__dict__.get(_READS)
    reads = cache.get("reads", []) if cache is not None and eval_transforms else []
    for dataset, read_key, tensors in reads:
        if dataset is source and read_key == key:
            return _rows(tensors, idx if whole else None)
    read = data if idx is None or whole else dataset_subset(data, idx)
    xs, ys, ts = [], [], []
    for x, y, t in experience_batches(strategy, dataset=read, batch_size=512):
        xs.append(x)
        ys.append(y)
        ts.append(torch.as_tensor(t))
    tensors = (torch.cat(xs), torch.cat(ys), torch.cat(ts).to(strategy.device))
    if eval_transforms:
        strategy.__dict__[_READS] = TransientCache(reads=[*reads[-1:], (source, key, tensors)])
        return _rows(tensors, idx if whole else None)
    return tensors


def _rows(tensors: tuple, idx: list[int] | None) -> tuple:
    """Copies of the kept ``tensors`` (all rows, or the rows ``idx``): a caller may change its own."""
    if idx is None:
        return tuple(t.clone() for t in tensors)
    return tuple(t.index_select(0, torch.as_tensor(idx, device=t.device)) for t in tensors)


def experience_example(strategy):
    """Two samples of the current experience as the example batch of
    :func:`~avalanche_plugins.core.layers.discover_layers` (with task labels for multi-task models);
    the RNG is left as it was."""
    batches = experience_batches(strategy, batch_size=2)
    x, _, t = next(batches)
    batches.close()  # restores the RNG state now
    return example_input(unwrap_model(strategy.model), x, torch.as_tensor(t))


def experience_layer_map(strategy):
    """:func:`~avalanche_plugins.core.layers.discover_layers` of ``strategy.model`` (inside a DDP
    wrapper: of the wrapped model) on :func:`experience_example`."""
    return discover_layers(unwrap_model(strategy.model), experience_example(strategy))


def metric_name(name: str, strategy, *, add_experience: bool = True, add_task: bool = True) -> str:
    """Avalanche's ``Name/phase/stream/TaskNNN/ExpNNN`` for ``strategy``'s current experience (on
    an online stream, its original experience: a value measured once per original experience is
    named by it, not by the sub-experience it was measured at)."""
    from avalanche.evaluation.metric_utils import get_metric_name

    experience = strategy.experience
    logging_view = experience.logging() if hasattr(experience, "logging") else experience
    try:
        origin = logging_view.origin_experience
    except (AttributeError, ValueError):  # offline (MaskedAttributeError is a ValueError)
        origin = None
    if origin is not None:
        logging_view = origin.logging() if hasattr(origin, "logging") else origin
    strategy.experience = logging_view
    try:
        return get_metric_name(name, strategy, add_experience=add_experience, add_task=add_task)
    finally:
        strategy.experience = experience


def preserved_rng(device):
    """A context that restores the RNG state on exit (measuring must not change the training run's
    random stream): ``torch.random.fork_rng`` over the CPU generator and, for a CUDA ``device``, that device's."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.random.fork_rng(devices=[index])
    return torch.random.fork_rng(devices=[])
