"""``--executor ray`` on a machine where Ray already runs (``ray start --head``, ``RAY_ADDRESS`` set):
without an address the executor starts a private local instance with its own CPUs and says so;
``address="auto"`` joins the running one. Plain ``ray.init(num_cpus=...)`` would fail there with
"When connecting to an existing cluster, num_cpus and num_gpus must not be provided".

The head this test starts is stopped by stopping its own processes (found by its port and its
session folder), never with ``ray stop``, which stops every Ray instance of the machine's user."""

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from avalanche_plugins.study.jobs import LocalExecutor, RayExecutor, run_jobs
from tests.study.jobs.test_executors_ray import JOBS, _numbers, fit

ray = pytest.importorskip("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _head_processes(port: int) -> list[psutil.Process]:
    """The processes of the Ray head listening on ``port``, and only those: its GCS server names the
    port, every process of its session names the session's folder, and the agents are their children."""
    own, session = [], None
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "gcs_server" in cmdline and f"--gcs_server_port={port}" in cmdline:
            session = next((a.split("=", 1)[1].rsplit("/logs", 1)[0] for a in proc.info["cmdline"]
                            if a.startswith("--log_dir=")), None)
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if (session and session in cmdline) or f":{port} " in cmdline + " " and "ray" in cmdline:
            own.append(proc)
    for proc in list(own):
        try:
            own += proc.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return list({proc.pid: proc for proc in own}.values())


def _stop(processes: list[psutil.Process], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL for what is left after ``grace`` seconds (some of Ray's processes
    drain for tens of seconds)."""
    for proc in processes:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


@pytest.fixture(scope="module")
def running_ray():
    """A Ray head started the way users start one (one CPU, so it is told apart from ours); stopped
    by stopping its own processes (found by its port and session folder), never with ``ray stop``."""
    if ray.is_initialized():
        ray.shutdown()
    cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    try:
        subprocess.run([cli, "start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
                        "--disable-usage-stats"], check=True, capture_output=True, timeout=180)
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _stop(_head_processes(port))
        assert not _head_processes(port), "the test's Ray head outlived it"


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
