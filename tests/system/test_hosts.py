"""Trials over hosts, one of them lost (#51): two "hosts" with addresses of their own (Linux network namespaces joined
to this one by veth pairs, made here and removed after), each running `segserve bench` with its own TorchServe
against one PostgreSQL on this side. One host is killed in the middle of a trial (every process in its namespace,
SIGKILL): its trial goes to the other host after the heartbeat, no point is lost or measured twice, and `bench
collect` lists the points a single-host run of the same suite plans. make test-long (a few minutes; root, `ip`)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from segserve.bench.search import study
from tests.conftest import ROOT
from tests.system.test_study_postgres import collected, running_postgres, shared_suite

pytestmark = pytest.mark.long
SUBNET = "10.231"  # hosts 10.231.<n>.2, this side 10.231.<n>.1: only between the namespaces and this host
HEARTBEAT_S = 2


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def hosts():
    """Two namespaces, each with loopback and a veth to this side; {name: (namespace, its address, this side's)}."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's `ip`")
    tag = os.getpid() % 10000
    made = {}
    try:
        for n, name in enumerate(("a", "b"), start=1):
            namespace, outer, inner = f"segserve-{tag}-{name}", f"sg{tag}{name}o", f"sg{tag}{name}i"
            ip("netns", "add", namespace)
            made[name] = (namespace, f"{SUBNET}.{n}.2", f"{SUBNET}.{n}.1")
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            ip("link", "set", inner, "netns", namespace)
            ip("addr", "add", f"{SUBNET}.{n}.1/24", "dev", outer)
            ip("link", "set", outer, "up")
            for args in (("addr", "add", f"{SUBNET}.{n}.2/24", "dev", inner), ("link", "set", inner, "up"), ("link", "set", "lo", "up")):
                ip("netns", "exec", namespace, "ip", *args)
        yield made
    finally:
        for namespace, _, _ in made.values():
            kill_namespace(namespace)
            ip("netns", "del", namespace, check=False)  # its veth end goes with it, and so the pair


def kill_namespace(namespace: str) -> list[int]:
    """SIGKILL to every process in the namespace: the host is lost, with its bench and its TorchServe."""
    pids = [int(pid) for pid in ip("netns", "pids", namespace, check=False).stdout.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


@pytest.fixture
def postgres_for(hosts):
    """PostgreSQL on this side, listening on loopback and on this side of each veth, trusting only the hosts."""
    listen = ("127.0.0.1", *(here for _, _, here in hosts.values()))
    with running_postgres(listen, tuple(outside for _, outside, _ in hosts.values())) as port:
        yield lambda address: f"postgresql://postgres@{address}:{port}/postgres"


def test_a_study_over_two_hosts_loses_one_mid_trial_and_no_point_is_lost_or_measured_twice(hosts, postgres_for, tmp_path, trained_weights):
    import optuna
    from optuna.trial import TrialState

    # two hosts share 2 cores here: the other's load is expected, not a disturbance; no budget: the whole grid
    suite = shared_suite(tmp_path / "hosts.yaml", "{strategy: optuna, sampler: tpe, seed: 1}", 1, 1, 4)
    planned = subprocess.run(
        [sys.executable, "-m", "segserve.cli", "bench", str(suite), "--dry-run", "--weights", str(trained_weights)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    everything = sorted(line.split()[1] for line in planned.splitlines() if line.strip()[:1].isdigit() and "seg_jpeg_fused-" in line)
    assert len(everything) == 6, planned  # the whole grid: what a single-host run measures
    started, logs = {}, {}
    for name, (namespace, _, here) in hosts.items():
        logs[name] = tmp_path / f"host-{name}.log"
        command = [sys.executable, "-m", "segserve.cli", "bench", str(suite), "--storage", postgres_for(here)]
        command += ["--weights", str(trained_weights), "--results", str(tmp_path / f"results-{name}"), "--heartbeat-s", str(HEARTBEAT_S)]
        with open(logs[name], "w") as log:
            started[name] = subprocess.Popen(
                ["ip", "netns", "exec", namespace, *command], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
    storage = study.open_storage(postgres_for("127.0.0.1"), None, HEARTBEAT_S)

    def trials(state=None):
        try:
            found = optuna.load_study(study_name="hosts", storage=storage)
        except KeyError:
            return []
        return found.get_trials(deepcopy=False, states=(state,) if state is not None else None)

    try:
        # host a is lost once it has finished a point and is measuring its next one: a RUNNING trial of its own
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not re.search(r"\] 1/\d+ ", logs["a"].read_text()):
            assert started["a"].poll() is None, logs["a"].read_text()
            time.sleep(0.5)
        time.sleep(3)  # into its next point's windows
        running_before = [t.number for t in trials(TrialState.RUNNING)]
        lost_pids = kill_namespace(hosts["a"][0])
        started["a"].wait(timeout=30)
        assert lost_pids and running_before, (lost_pids, running_before)
        code = started["b"].wait(timeout=600)
    finally:
        for process in started.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
    text = {name: path.read_text() for name, path in logs.items()}
    assert code == 0, text["b"]
    every_trial = trials()
    retried = [t for t in every_trial if "failed_trial" in t.system_attrs]  # Optuna's heartbeat retry: a copy of it
    counts = {"started": len(every_trial), "finished": len(trials(TrialState.COMPLETE)), "failed": len(trials(TrialState.FAIL))}
    counts["retried"] = len(retried)
    print(f"trials: {counts}; host a killed with {len(lost_pids)} process(es) in its namespace")

    folder = collected("hosts", postgres_for("127.0.0.1"), tmp_path / "all")
    run_ids = sorted(p.stem for p in (folder / "runs").glob("*.json"))
    assert run_ids == everything  # no point lost, none twice: the single-host run's list
    # host a's trial in flight failed when its heartbeat stopped, and its copy was measured on host b
    by_host = {name: {p.stem for p in (tmp_path / f"results-{name}").glob("hosts/*/runs/*.json")} for name in hosts}
    assert retried and by_host["a"] and by_host["b"] and not by_host["a"] & by_host["b"], (counts, by_host)
    lost = {t.number: t.user_attrs.get("point") for t in every_trial}
    for trial in retried:  # the copy may itself lose a claim to host b's own trial of that point: the point is what counts
        assert lost[trial.system_attrs["failed_trial"]] in by_host["b"] - by_host["a"], (trial.number, lost, by_host)
    assert by_host["a"] | by_host["b"] == set(everything)
