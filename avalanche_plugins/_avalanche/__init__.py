"""Adapters between Avalanche strategies and the plain-torch estimators (the only package, besides
``*plugin*.py`` / ``*metric*.py`` files, allowed to import ``avalanche``)."""
