"""The grid-key grammar of a strategy's ``grid:``, parsed in one place.

A key names where its values go:

* ``ARG`` — the strategy's own kwargs;
* ``training.KEY`` — the training settings (``lr``, ``epochs``, ...);
* ``PLUGIN.ARG`` or ``plugins[i].ARG`` — the kwargs of one of the strategy's plugins (by class
  name, or by position).

:func:`grid_target` parses a key: the loader calls it once per key, for its checks and for the
typed :class:`~avalanche_plugins.study.contracts.specs.GridKey` that build and run then read
(:func:`avalanche_plugins.study.contracts.specs.apply_setting`); a strategy saved in a ``results.json`` is
read back with :meth:`~avalanche_plugins.study.contracts.specs.StrategySpec.from_dict`, which parses its keys here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from avalanche_plugins.study.catalog.registry import ConfigError

__all__ = ["grid_target", "plugin_index"]


def plugin_index(owner: str, plugins: Sequence[Mapping], where: str) -> int:
    """The position of the plugin ``owner`` names (``plugins[i]`` or a plugin's class name) in
    ``plugins``; :class:`ConfigError` naming ``where`` otherwise.

    Example:
        >>> plugins = [{"name": "ReplayPlugin"}, {"name": "EWCPlugin"}]
        >>> plugin_index("EWCPlugin", plugins, "grid"), plugin_index("plugins[0]", plugins, "grid")
        (1, 0)
    """
    if owner.startswith("plugins[") and owner.endswith("]") and owner[8:-1].isdigit():
        index = int(owner[8:-1])
        if index < len(plugins):
            return index
    for index, plugin in enumerate(plugins):
        if plugin["name"] == owner:
            return index
    raise ConfigError(f"{where}: {owner!r} is neither 'training', a plugin of this strategy "
                      f"({', '.join(p['name'] for p in plugins) or 'none'}) nor plugins[i]")


def grid_target(key: str, plugins: Sequence[Mapping], where: str) -> tuple[str, int | None, str]:
    """Where a grid key goes: ``(kind, plugin index, argument)`` with ``kind`` one of
    ``"strategy"``, ``"training"``, ``"plugin"`` (the index only for ``"plugin"``).

    Example:
        >>> grid_target("training.lr", [], "g"), grid_target("ewc_lambda", [], "g")
        (('training', None, 'lr'), ('strategy', None, 'ewc_lambda'))
    """
    owner, _, argument = key.rpartition(".")
    if not owner:
        return "strategy", None, argument
    if owner == "training":
        return "training", None, argument
    return "plugin", plugin_index(owner, plugins, where), argument
