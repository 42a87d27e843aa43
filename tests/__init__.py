"""The test suite; its folders mirror the package (``tests/<subpackage>/test_<module>.py``, see
``tests/repository/test_layout.py``)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent  # the checkout under test, wherever a test file lies
