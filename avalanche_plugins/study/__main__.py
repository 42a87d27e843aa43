"""``python -m avalanche_plugins.study``: the same as the ``avalanche-study`` command."""

from avalanche_plugins.study.cli import main

if __name__ == "__main__":
    main()
