"""``avalanche-study`` as a user gets it: the wheel installed into a fresh virtual environment,
run from a folder outside the checkout with the user's own model module beside the config and an
Avalanche strategy this project never mentions (MAS).

The fresh environment borrows the test environment's third-party packages (torch, avalanche, ...)
through a ``.pth`` file, because nothing may be downloaded here; the package itself comes only
from the wheel (its editable install is not visible: the borrowed folder is not a site folder, so
its ``.pth`` hooks do not run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests import REPO_ROOT

ROOT = REPO_ROOT

CONFIG = """
name: mine
seeds: 1
scenarios: [{name: digits2, benchmark: split_digits, n_experiences: 2}]
model: {name: "my_models:small_net", kwargs: {width: 24}}
training: {lr: 0.05, epochs: 1, batch_size: 64}
strategies:
  - Naive
  - {name: MAS, kwargs: {lambda_reg: 1.0}}
metrics:
  - {name: OptimizationReadinessMetric, kwargs: {n_samples: 64, n_batches: 4}}
"""

MODEL = """
import math
from torch import nn


def small_net(input_shape, n_classes, width=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(), nn.Linear(width, n_classes))
"""


def _run(cmd, cwd, env=None, timeout=600):
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{cmd}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _source_tree(dest: Path) -> Path:
    """The checkout's files (tracked, and untracked but not ignored) copied to ``dest``: a wheel
    built from them never carries a stale ``build/`` left by an earlier build (setuptools reuses
    it). Without git: the checkout itself."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        return ROOT
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(folder, env)``: a fresh venv with the wheel and its ``[study]`` extra's packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
          str(_source_tree(tmp / "src"))], cwd=tmp)
    wheel = next((tmp / "dist").glob("avalanche_plugins-*.whl"))
    _run([sys.executable, "-m", "venv", str(tmp / "env")], cwd=tmp)
    python = tmp / "env" / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp).stdout.strip())
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--ignore-installed", str(wheel)],
         cwd=tmp)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{tmp / 'env' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return tmp, env, wheel


def test_the_wheel_holds_the_runner_and_declares_its_extra(installed):
    _, _, wheel = installed
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "avalanche_plugins/study/cli.py" in names and "avalanche_plugins/study/catalog/datasets.py" in names
    assert not any(n.startswith(("benchmarks/", "tests/")) for n in names)
    assert not any(n.endswith(("_cli.py", "cifar_fixture.py")) for n in names)  # no benchmark CLI, no fixture
    assert "avalanche-study = avalanche_plugins.study.cli:main" in entry_points
    assert "Provides-Extra: study" in metadata
    for requirement in ("pyyaml", "scipy", "tqdm", "torchvision", "scikit-learn"):
        assert f"Requires-Dist: {requirement}; extra == \"study\"" in metadata, requirement


def test_a_user_runs_a_study_from_their_own_folder(installed):
    tmp, env, _ = installed
    work = tmp / "my_project"
    work.mkdir()
    (work / "my_models.py").write_text(MODEL)
    (work / "study.yaml").write_text(textwrap.dedent(CONFIG))
    where = _run(["python", "-c", "import avalanche_plugins, importlib.util; print(avalanche_plugins.__file__); "
                  "print(importlib.util.find_spec('benchmarks'))"], cwd=work, env=env).stdout.split()
    assert where[0].startswith(str(tmp / "env")) and where[1] == "None"  # the wheel's copy; no benchmarks
    printed = _run(["avalanche-study", "run", "study.yaml", "--no-progress"], cwd=work, env=env).stdout
    out = work / "out" / "study" / "mine"
    assert (out / "report.md").is_file() and (out / "tables.tex").is_file()
    for title in ("ACC ↑", "ACC task-IL ↑", "BWT ↑", "Forgetting ↓", "FWT ↑", "time (s)", "diagnostics (s)",
                  "peak memory (MB)"):
        assert title in printed
    assert "| MAS | default |" in printed and "failed" not in printed
    assert "#### digits2 / MAS (default)" in (out / "tables.md").read_text()
    # a broken copy of the config: `check` names every mistake in one go
    (work / "broken.yaml").write_text(textwrap.dedent(CONFIG).replace("lambda_reg", "lambda_regg")
                                      .replace("n_experiences: 2", "n_experiences: 3").replace("Naive", "Naiv"))
    result = subprocess.run(["avalanche-study", "check", "broken.yaml"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2
    assert "3 errors:" in result.stderr and "did you mean Naive?" in result.stderr
    assert "did you mean 'lambda_reg'?" in result.stderr and "scenarios[0].n_experiences" in result.stderr
