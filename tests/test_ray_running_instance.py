"""``--executor ray`` on a machine where Ray already runs (``ray start --head``, ``RAY_ADDRESS`` set):
without an address the executor starts a private local instance with its own CPUs and says so;
``address="auto"`` joins the running one. Plain ``ray.init(num_cpus=...)`` would fail there with
"When connecting to an existing cluster, num_cpus and num_gpus must not be provided".

The head this test starts is stopped by stopping its own process tree (``ray start --block`` in a
session of its own), never with ``ray stop``, which stops every Ray instance of the machine's user."""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from avalanche_plugins.study.harness.jobs import LocalExecutor, RayExecutor, run_jobs
from tests.test_ray_executor import JOBS, _numbers, fit

ray = pytest.importorskip("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop_tree(process: subprocess.Popen, timeout: float = 30.0) -> None:
    """Terminate ``process`` and every process it started (and only those), then kill what is left."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for proc in tree:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=timeout)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait(timeout=timeout)


def _wait_for_head(cli: str, address: str, process: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited with {process.returncode}")
        if subprocess.run([cli, "status", f"--address={address}"], capture_output=True, timeout=60).returncode == 0:
            return
        time.sleep(1.0)
    raise TimeoutError(f"the Ray head at {address} did not come up in {timeout:.0f} s")


@pytest.fixture(scope="module")
def running_ray():
    """A Ray head started the way users start one (one CPU, so it is told apart from ours), in the
    foreground (``--block``) so that this test knows, and stops, exactly the processes it started."""
    if ray.is_initialized():
        ray.shutdown()
    cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    address = f"127.0.0.1:{port}"
    head = subprocess.Popen([cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_head(cli, address, head)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _stop_tree(head)


@pytest.mark.slow  # starts three Ray instances: about a minute
def test_ray_without_address_starts_its_own_instance_beside_a_running_one(running_ray, monkeypatch, capsys):
    monkeypatch.setenv("RAY_ADDRESS", running_ray)  # as `ray start` tells users to export
    local = run_jobs(fit, JOBS, executor=LocalExecutor(1), progress=False)
    with RayExecutor(num_cpus=2) as ex:
        rows = run_jobs(fit, JOBS, executor=ex, progress=False)
        assert ex.started and ray.cluster_resources()["CPU"] == 2  # ours, not the 1-CPU head
    assert not ray.is_initialized()
    assert _numbers(rows) == _numbers(local)
    message = capsys.readouterr().err
    assert "started a private local instance with 2 CPUs" in message and "--address auto" in message

    with RayExecutor(address="auto") as ex:  # asked to join: the running head and its one CPU
        rows = run_jobs(fit, JOBS[:2], executor=ex, progress=False)
        assert ray.cluster_resources()["CPU"] == 1
    assert _numbers(rows) == _numbers(local[:2])
    assert "joined the cluster at 'auto' (1 CPUs)" in capsys.readouterr().err
    # leaving the joined cluster did not stop it
    assert subprocess.run([shutil.which("ray") or str(Path(sys.executable).with_name("ray")), "status",
                           f"--address={running_ray}"], capture_output=True, timeout=120).returncode == 0
