"""Does the strategy's training loop call the callbacks a plugin's effect depends on?

Avalanche's SGD loop (``SGDUpdate.training_epoch``) triggers ``before_forward``, ``after_forward``,
``before_backward``, ``after_backward``, ``before_update`` and ``after_update`` on every
iteration. Strategies with their own loop may not: MER's meta-update loop
(``MetaUpdate.training_epoch``) runs its inner SGD steps and Reptile interpolations without any of
them, so a penalty added in ``before_backward`` is never added and a mask re-imposed in
``after_update`` is never re-imposed, silently. :func:`require_callbacks` reads the source of the
strategy's effective ``training_epoch`` before training and refuses when a needed callback is not
named in it (a user's template that triggers it by ``trigger_plugins(self, "before_backward")``
names it too). When the source cannot be read the check passes and the plugins' own runtime
guards (a callback counted per iteration) stop the run at the first iteration instead.
"""

from __future__ import annotations

import inspect
import re

__all__ = ["missing_callbacks", "require_callbacks"]


def _loop_sources(strategy) -> tuple[str | None, str | None]:
    """``(class whose training_epoch runs, the source of it and of every training_epoch it reaches
    through super())``; ``(None, None)`` when a source cannot be read."""
    owner, sources = None, []
    for cls in type(strategy).__mro__:
        method = vars(cls).get("training_epoch")
        if method is None:
            continue
        try:
            source = inspect.getsource(method)
        except (OSError, TypeError):
            return None, None
        owner = owner or cls.__name__
        sources.append(source)
        if not re.search(r"super\([^)]*\)\s*\.\s*training_epoch", source):
            break
    return owner, "\n".join(sources) if sources else None


def missing_callbacks(strategy, callbacks) -> tuple[str | None, list[str]]:
    """``(class defining training_epoch, [callbacks its source never names])``; ``(None, [])``
    when the source is not available. A ``training_epoch`` that calls ``super().training_epoch``
    is read together with the one it calls."""
    owner, source = _loop_sources(strategy)
    if source is None:
        return None, []
    return owner, [name for name in callbacks if name not in source]


def require_callbacks(component: str, strategy, callbacks, effect: str) -> None:
    """Refuse ``strategy`` before training when its training loop never calls one of ``callbacks``.

    :param effect: what the callbacks do for ``component`` (for the message).
    :raises ValueError: naming the component, the strategy, the loop and the callbacks.
    """
    owner, missing = missing_callbacks(strategy, callbacks)
    if missing:
        raise ValueError(
            f"{component} refuses {type(strategy).__name__} before training: its training loop "
            f"({owner}.training_epoch) never calls {', '.join(missing)}, where {effect}; attached to it, "
            f"{component} would silently have no effect. Use a strategy with Avalanche's SGD loop "
            "(Naive, Replay, ER-ACE, DER, ...), or a template whose training_epoch triggers "
            f"{', '.join(missing)}")
