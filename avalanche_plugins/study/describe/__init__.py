"""A config file → a validated, typed :class:`~avalanche_plugins.study.describe.config.Study`
(:mod:`~avalanche_plugins.study.describe.config`), with the shipped tuned recipes it may start from
(:mod:`~avalanche_plugins.study.describe.recipes`).

The rule of this folder (tests/study/test_layout.py): it imports none of ``run`` and ``report``;
below it only ``contracts``, ``catalog`` and ``jobs``.
"""
