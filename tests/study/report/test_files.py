"""``study.report.files.load_results``: a saved results.json, plain or gzip-compressed."""

import gzip
import json

import pytest

from avalanche_plugins.study.report.files import load_results

SAVED = {"command": "python -m benchmarks.x", "runs": [{"seed": 0, "acc": 0.5}, {"seed": 1, "acc": 0.25}]}


def test_a_compressed_results_file_reads_back_as_the_plain_one(tmp_path):
    plain = tmp_path / "plain" / "results.json"
    packed = tmp_path / "packed" / "results.json.gz"
    for path in (plain, packed):
        path.parent.mkdir()
    plain.write_text(json.dumps(SAVED))
    packed.write_bytes(gzip.compress(json.dumps(SAVED).encode(), mtime=0))
    assert load_results(plain) == load_results(packed) == SAVED
    # a folder holding either form is read the same way, and so is the plain name of a packed file
    assert load_results(plain.parent) == load_results(packed.parent) == SAVED
    assert load_results(packed.parent / "results.json") == SAVED


def test_a_folder_prefers_the_plain_file_when_both_are_there(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"which": "plain"}))
    (tmp_path / "results.json.gz").write_bytes(gzip.compress(b'{"which": "packed"}'))
    assert load_results(tmp_path) == {"which": "plain"}


def test_a_folder_without_results_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="no results.json"):
        load_results(tmp_path)
