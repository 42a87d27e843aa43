"""A two-node Ray cluster on this machine (issue 43): a head (0 CPUs) and a worker in two network
namespaces joined by a veth pair on a private /24 this test makes itself; a small study run from the
head with ``--executor ray --address`` must run every job on the worker node (each row's ``node_ip``)
and give the local executor's rows; every per-run file reaches the driver's ``--out``. A second test
kills the worker node in the middle of a study: the study says that no node can run its jobs, stops
at ``--wait-limit`` naming the lost node and the jobs not done, keeps the finished rows in its
cache, and a rerun with a worker back finishes without repeating one.

Cleanup, whatever happens: the Ray processes are found as the processes inside the test's two
namespaces (their ``/proc/PID/ns/net`` is the namespace's), stopped by id (SIGTERM, then SIGKILL),
then the namespaces are deleted (which removes the veth pair). Nothing else is stopped, and no
traffic leaves the test's own addresses. Skipped, with the reason, where network namespaces cannot
be made (not root, no ``ip``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests import REPO_ROOT

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # two Ray nodes and a study: about a minute or two

STUDY = {"name": "cluster", "seeds": 2, "scenarios": [{"benchmark": "split_digits", "n_experiences": 2}],
         "model": {"name": "mlp", "kwargs": {"hidden": [16]}}, "training": {"epochs": 1, "batch_size": 64},
         "strategies": ["Naive", {"name": "EWC", "kwargs": {"ewc_lambda": 10.0}}]}
RAY = str(Path(sys.executable).with_name("ray"))
ROOT = REPO_ROOT  # the checkout whose package is under test


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
    # the driver and the Ray nodes import the package under test, whatever the environment has installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    if (Path.home() / ".ray" / "auth_token").is_file():  # Ray 2.60 then requires the token of every client
        env["RAY_AUTH_MODE"] = "token"
    return env


class Worker:
    """The worker node: :meth:`kill` stops its Ray processes (by id, the namespace stays),
    :meth:`start` starts a fresh one at the same address."""

    def __init__(self, inside, namespace: str, address: str, ip: str, temp: Path):
        self.inside, self.namespace, self.address, self.ip, self.temp, self.starts = inside, namespace, address, ip, temp, 0

    def start(self, cpus: int = 2) -> None:
        self.starts += 1
        joined = self.inside(self.namespace, RAY, "start", f"--address={self.address}", f"--node-ip-address={self.ip}",
                             f"--num-cpus={cpus}", "--disable-usage-stats", f"--temp-dir={self.temp / f'w{self.starts}'}")
        assert joined.returncode == 0, joined.stderr[-2000:]

    def kill(self) -> None:
        for pid in _namespace_processes(self.namespace):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _namespace_processes(self.namespace) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _namespace_processes(self.namespace)


@pytest.fixture()
def cluster(tmp_path):
    """``(run_in_head, head address, worker ip, Worker, start_in_head)``: a head with 0 CPUs and a
    2-CPU worker; ``start_in_head`` starts a command in the head's namespace without waiting."""
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
        # the head's GCS checks each node every second (Ray's default: every 3 s) and calls it dead after
        # 5 failed checks: a killed worker is seen dead in about 5 s; a slow one still has 10 s per answer
        env["RAY_health_check_period_ms"] = "1000"
        started = inside(head, RAY, "start", "--head", f"--node-ip-address={head_ip}", "--port=6379", "--num-cpus=0",
                         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp / 'h'}")
        assert started.returncode == 0, started.stderr[-2000:]
        node = Worker(inside, worker, address, worker_ip, temp)
        node.start()

        def start_in_head(*cmd, cwd=None):
            return subprocess.Popen(["ip", "netns", "exec", head, *cmd], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)

        yield (lambda *cmd, **kw: inside(head, *cmd, **kw)), address, worker_ip, node, start_in_head
    finally:
        _stop_namespace(worker)
        _stop_namespace(head)
        shutil.rmtree(temp, ignore_errors=True)
        assert not _namespace_processes(head) and not _namespace_processes(worker)
        assert head not in _ip("netns", "list").stdout and worker not in _ip("netns", "list").stdout


def test_a_study_on_a_two_node_cluster_runs_on_the_worker_and_gives_the_local_rows(cluster, tmp_path):
    from avalanche_plugins.study import run_study

    run_in_head, address, worker_ip, _, _ = cluster
    work = tmp_path / "work"  # the driver's working directory: what Ray ships to the worker
    work.mkdir()
    (work / "study.yaml").write_text(yaml.safe_dump(STUDY))
    done = run_in_head(sys.executable, "-m", "avalanche_plugins.study", "run", "study.yaml", "--executor", "ray",
                       "--address", address, "--out", str(tmp_path / "remote"), "--no-progress", cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"joined the cluster at '{address}'" in done.stderr
    remote = json.loads((tmp_path / "remote" / "results.json").read_text())["runs"]
    assert len(remote) == 4 and {r["node_ip"] for r in remote} == {worker_ip}  # the head has no CPU to run one
    local = [r.as_dict() for r in run_study(STUDY, out=tmp_path / "local", progress=False).rows]
    where = ("wall_s", "train_s", "diagnostics_s", "figures_s", "callback_s", "peak_memory_mb", "node_ip")

    def numbers(rows):
        return sorted(({k: v for k, v in r.items() if k not in where} for r in rows),
                      key=lambda r: (r["strategy"], r["seed"]))

    assert numbers(remote) == numbers(local)
    assert _run_files(tmp_path / "remote") == _run_files(tmp_path / "local") != {}  # runs/: back on the driver


def _run_files(out: Path) -> dict:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted((out / "runs").rglob("*")) if p.is_file()}


def _cached(out: Path) -> list[dict]:
    path = out / "jobs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def test_a_lost_worker_stops_the_study_at_its_wait_limit_and_a_rerun_resumes(cluster, tmp_path):
    run_in_head, address, worker_ip, worker, start_in_head = cluster
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "study.yaml").write_text(yaml.safe_dump(STUDY))
    command = (sys.executable, "-m", "avalanche_plugins.study", "run", "study.yaml", "--executor", "ray",
               "--address", address, "--out", str(out), "--no-progress", "--wait-limit", "10")
    driver = start_in_head(*command, cwd=work)
    try:
        deadline = time.monotonic() + 300
        while len(_cached(out)) < 2 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_cached(out)) == 2, "the first two jobs (two CPUs) did not finish"
        worker.kill()  # mid-study, the next two jobs started: the worker node's Ray processes, by id
        stdout, stderr = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    finished = _cached(out)
    assert driver.returncode == 1, stderr[-3000:]
    assert len(finished) == 2 and not (out / "results.json").exists()
    assert f"Ray: no alive node has the 1 CPU(s) a job needs (lost node(s): {worker_ip})" in stderr
    assert "job(s) waiting" in stderr
    stop = re.escape(f"no alive node has the 1 CPU(s) a job needs (lost node(s): {worker_ip}); 2 job(s) not done: ")
    assert re.search(r"avalanche-study run: stopped after 1\d s \(wait limit 10 s\): " + stop + "split_digits/",
                     stderr), stderr[-3000:]
    assert "a rerun with a node back resumes" in stderr

    worker.start()  # a worker is back: the rerun runs only the jobs not done
    done = run_in_head(*command, cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    cached = _cached(out)
    assert cached[:len(finished)] == finished and len(cached) == 4  # nothing lost, nothing repeated
    assert len({entry["key"] for entry in cached}) == 4
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert len(runs) == 4 and {r["node_ip"] for r in runs} == {worker_ip} and {r["status"] for r in runs} == {"ok"}
