"""``code_version`` / ``git_state``: a results file names the commit, and says when the code that ran
differs from it; ``source_version`` is recorded beside it."""

import json
import subprocess

import pytest

from avalanche_plugins.study import jobs
from avalanche_plugins.study.jobs import git_state

pytestmark = pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0,
                                reason="needs git")


def _git(root, *args) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("docs\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "first")
    return tmp_path


def test_a_clean_checkout_is_its_commit(repo):
    assert git_state(repo, [repo / "pkg"]) == f"git:{_git(repo, 'rev-parse', 'HEAD')}"


@pytest.mark.parametrize("change", ["modified", "untracked", "staged"])
def test_changed_code_marks_the_commit_dirty(repo, change):
    head = _git(repo, "rev-parse", "HEAD")
    target = repo / "pkg" / ("new.py" if change == "untracked" else "mod.py")
    target.write_text("x = 2\n")
    if change == "staged":
        _git(repo, "add", ".")
    assert git_state(repo, [repo / "pkg"]) == f"git:{head}+dirty"


def test_changes_outside_the_code_or_not_python_keep_it_clean(repo):
    head = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("edited\n")
    (repo / "pkg" / "notes.txt").write_text("not code\n")
    assert git_state(repo, [repo / "pkg"]) == f"git:{head}"


def test_results_record_the_source_hash(tmp_path):

    from avalanche_plugins.study.jobs import source_version
    from avalanche_plugins.study.report.files import write_results

    write_results(tmp_path, config={}, rows=[], summary=[], wall_seconds=0.0, data={})
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["source_version"] == source_version() and saved["source_version"].startswith("src:")
    assert saved["code_version"].startswith(("git:", "avalanche_plugins "))


def test_source_version_changes_with_the_code_only(tmp_path, monkeypatch):
    jobs.source_version.cache_clear()
    before = jobs.source_version()
    assert before.startswith("src:") and jobs.source_version() == before
    jobs.source_version.cache_clear()
    assert jobs.source_version() == before  # reading again: the same tree, the same version


def test_code_version_names_a_commit_or_the_package():
    version = jobs.code_version()
    assert version.startswith("git:") or version.startswith("avalanche_plugins ")
