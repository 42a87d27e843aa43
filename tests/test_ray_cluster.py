"""A two-node Ray cluster on this machine (issue 43): a head (0 CPUs) and a worker in two network
namespaces joined by a veth pair on a private /24 this test makes itself; a small study run from the
head with ``--executor ray --address`` must run every job on the worker node (each row's ``node_ip``)
and give the local executor's rows.

Cleanup, whatever happens: the Ray processes are found as the processes inside the test's two
namespaces (their ``/proc/PID/ns/net`` is the namespace's), stopped by id (SIGTERM, then SIGKILL),
then the namespaces are deleted (which removes the veth pair). Nothing else is stopped, and no
traffic leaves the test's own addresses. Skipped, with the reason, where network namespaces cannot
be made (not root, no ``ip``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # two Ray nodes and a study: about a minute or two

STUDY = {"name": "cluster", "seeds": 2, "scenarios": [{"benchmark": "split_digits", "n_experiences": 2}],
         "model": {"name": "mlp", "kwargs": {"hidden": [16]}}, "training": {"epochs": 1, "batch_size": 64},
         "strategies": ["Naive", {"name": "EWC", "kwargs": {"ewc_lambda": 10.0}}]}
RAY = str(Path(sys.executable).with_name("ray"))


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _namespace_processes(name: str) -> list[int]:
    """Ids of the processes whose network namespace is ``name``'s (only they are ever stopped)."""
    try:
        inode = os.stat(f"/run/netns/{name}").st_ino
    except FileNotFoundError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    pids.append(int(entry))
            except (FileNotFoundError, PermissionError, ProcessLookupError):
                continue
    return pids


def _stop_namespace(name: str, grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _namespace_processes(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while _namespace_processes(name) and time.monotonic() < deadline:
            time.sleep(0.2)
    _ip("netns", "del", name)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if (Path.home() / ".ray" / "auth_token").is_file():  # Ray 2.60 then requires the token of every client
        env["RAY_AUTH_MODE"] = "token"
    return env


@pytest.fixture()
def cluster(tmp_path):
    """``(run_in_head, head address, worker ip)``: a head with 0 CPUs and a 2-CPU worker."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's `ip`")
    tag = f"{os.getpid() % 100000}"
    head, worker = f"aph{tag}", f"apw{tag}"
    subnet = f"10.213.{os.getpid() % 250}"
    head_ip, worker_ip = f"{subnet}.1", f"{subnet}.2"
    temp = Path(tempfile.mkdtemp(prefix="apray", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    if _ip("netns", "add", head).returncode:
        shutil.rmtree(temp, ignore_errors=True)
        pytest.skip(f"this machine does not allow network namespaces: {_ip('netns', 'add', head).stderr.strip()}")
    try:
        _ip("netns", "add", worker)
        for args in (("link", "add", f"vh{tag}", "type", "veth", "peer", "name", f"vw{tag}"),
                     ("link", "set", f"vh{tag}", "netns", head), ("link", "set", f"vw{tag}", "netns", worker),
                     ("-n", head, "addr", "add", f"{head_ip}/24", "dev", f"vh{tag}"),
                     ("-n", worker, "addr", "add", f"{worker_ip}/24", "dev", f"vw{tag}"),
                     ("-n", head, "link", "set", f"vh{tag}", "up"), ("-n", worker, "link", "set", f"vw{tag}", "up"),
                     ("-n", head, "link", "set", "lo", "up"), ("-n", worker, "link", "set", "lo", "up")):
            done = _ip(*args)
            assert done.returncode == 0, (args, done.stderr)
        env = _env()

        def inside(ns, *cmd, timeout=600, cwd=None):
            return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                                  timeout=timeout, env=env, cwd=cwd)

        address = f"{head_ip}:6379"
        started = inside(head, RAY, "start", "--head", f"--node-ip-address={head_ip}", "--port=6379", "--num-cpus=0",
                         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp / 'h'}")
        assert started.returncode == 0, started.stderr[-2000:]
        joined = inside(worker, RAY, "start", f"--address={address}", f"--node-ip-address={worker_ip}",
                        "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={temp / 'w'}")
        assert joined.returncode == 0, joined.stderr[-2000:]
        yield (lambda *cmd, **kw: inside(head, *cmd, **kw)), address, worker_ip
    finally:
        _stop_namespace(worker)
        _stop_namespace(head)
        shutil.rmtree(temp, ignore_errors=True)
        assert not _namespace_processes(head) and not _namespace_processes(worker)
        assert head not in _ip("netns", "list").stdout and worker not in _ip("netns", "list").stdout


def test_a_study_on_a_two_node_cluster_runs_on_the_worker_and_gives_the_local_rows(cluster, tmp_path):
    from avalanche_plugins.study import run_study

    run_in_head, address, worker_ip = cluster
    work = tmp_path / "work"  # the driver's working directory: what Ray ships to the worker
    work.mkdir()
    (work / "study.yaml").write_text(yaml.safe_dump(STUDY))
    done = run_in_head(sys.executable, "-m", "avalanche_plugins.study", "run", "study.yaml", "--executor", "ray",
                       "--address", address, "--out", str(tmp_path / "remote"), "--no-progress", cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"joined the cluster at '{address}'" in done.stderr
    remote = json.loads((tmp_path / "remote" / "results.json").read_text())["runs"]
    assert len(remote) == 4 and {r["node_ip"] for r in remote} == {worker_ip}  # the head has no CPU to run one
    local = run_study(STUDY, out=tmp_path / "local", progress=False).rows
    where = ("wall_s", "train_s", "diagnostics_s", "callback_s", "peak_memory_mb", "node_ip")

    def numbers(rows):
        return sorted(({k: v for k, v in r.items() if k not in where} for r in rows),
                      key=lambda r: (r["strategy"], r["seed"]))

    assert numbers(remote) == numbers(local)
