"""One study in a real PostgreSQL (Debian's `postgresql`, installed by `make setup-postgres`, started here on a free
loopback port in a temporary directory): two `segserve bench` processes with their own TorchServe share it,
no point is measured twice, `bench collect` writes one result folder; a search whose process dies hands its
point to another through the heartbeat."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from segserve.bench.search import study
from segserve.serving.ts_config import free_port_base
from tests.conftest import ROOT
from tests.unit.test_search import record, space
from tests.unit.test_study import shared


def postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its programs as the `postgres` user the Debian package creates."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextmanager
def running_postgres(listen: tuple[str, ...] = ("127.0.0.1",), clients: tuple[str, ...] = ()):
    """A PostgreSQL of its own in a temporary directory on a free port, listening on `listen`, trusting loopback
    and the `clients` addresses; yields its port. Skips where PostgreSQL cannot be installed."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed and `make setup-postgres` could not install it (apt-get install postgresql)")
    home = Path(tempfile.mkdtemp(prefix="segserve-pg-"))
    data = home / "data"
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    port = free_port_base()
    subprocess.run(
        as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]), check=True, capture_output=True
    )
    with open(data / "pg_hba.conf", "a") as hba:
        hba.writelines(f"host all all {client}/32 trust\n" for client in clients)
    options = f"-p {port} -k {home} -c listen_addresses={','.join(listen)}"
    subprocess.run(
        as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(home / "log"), "-w", "start"]),
        check=True,
        capture_output=True,
    )
    try:
        yield port
    finally:
        subprocess.run(as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]), capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_url():
    with running_postgres() as port:
        # the password is ignored (trust) but kept, so that it shows where a URL would leak it
        yield f"postgresql://postgres:pg-secret@127.0.0.1:{port}/postgres"


def shared_suite(path: Path, search: str, warmup_s: float, window_s: float, max_windows: int) -> Path:
    """A small fused-pipeline grid (3 batch sizes × 2 worker counts) for bench processes that share one study."""
    path.write_text(
        textwrap.dedent(
            f"""
            name: {path.stem}
            targets: [seg_jpeg_fused]
            inputs: [{{images: ["{ROOT / "samples" / "shapes_0.jpg"}"]}}]
            grid:
              archive: {{batch_size: [1, 2, 4]}}
              runtime: {{workers: [1, 2]}}
              load: {{concurrency: [4]}}
            # two servers share 2 cores here: the other process's load is expected, not a disturbance
            load: {{warmup_s: {warmup_s}, window_s: {window_s}, stable_windows: 2, max_windows: {max_windows}, stability_tolerance: 0.5,
                    max_others_share: 1.0, bare_forward_s: 0.6}}
            constraints: {{requests_failed: {{max: 0}}}}
            search: {search}
            """
        )
    )
    return path


def collected(name: str, storage_url: str, results: Path) -> Path:
    """`segserve bench collect NAME --storage URL` of a study two bench processes filled, each point once; its folder."""
    command = [sys.executable, "-m", "segserve.cli", "bench", "collect", name, "--storage", storage_url, "--results", str(results)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # the figures of the closing note (pytest -s)
    assert "from 2 process(es)" in done.stdout and "0 measured twice" in done.stdout
    (folder,) = (results / name).iterdir()
    return folder


def test_a_dead_search_hands_its_point_to_another_through_postgresql(postgres_url):
    points = space()[:8]
    dying = shared(study.open_storage(postgres_url, None, heartbeat_s=1), 0, points, limit=8, name="handover")
    lost = dying.ask()
    dying.heartbeat.stop()  # its process died mid-point
    time.sleep(4.5)  # grace: 3 heartbeats
    other = shared(study.open_storage(postgres_url, None, heartbeat_s=1), 7, points, limit=8, name="handover")
    taken = other.ask()
    assert taken.run_id == lost.run_id
    other.tell(taken, record(taken))
    other.close()


def test_two_bench_processes_share_one_study_and_collect_writes_it(postgres_url, tmp_path, trained_weights):
    suite = shared_suite(tmp_path / "shared.yaml", "{strategy: optuna, sampler: tpe, budget: {points: 4}, seed: 1}", 0.5, 0.5, 3)
    common = [sys.executable, "-m", "segserve.cli", "bench", str(suite), "--storage", postgres_url, "--weights", str(trained_weights)]
    processes = []
    for index in range(2):
        base = free_port_base()  # claimed: the second call gets other ports
        log = (tmp_path / f"bench{index}.log").open("w")
        command = [*common, "--results", str(tmp_path / f"results{index}"), "--port-base", str(base)]
        processes.append((subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    try:
        codes = [process.wait(timeout=400) for process, _ in processes]
    finally:
        for process, log in processes:
            if process.poll() is None:
                os.killpg(process.pid, 15)
                process.wait(timeout=60)
            log.close()
    logs = [(tmp_path / f"bench{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    assert all("pg-secret" not in text for text in logs)
    assert all("FAILED" not in text for text in logs), logs  # e.g. archives of one name built at once by both
    measured = [sorted(p.stem for p in (tmp_path / f"results{i}").glob("shared/*/runs/*.json")) for i in range(2)]
    every = measured[0] + measured[1]
    assert len(every) == len(set(every)) == 4, measured  # the budget, spread over both, none twice
    assert measured[0] and measured[1], measured

    folder = collected("shared", postgres_url, tmp_path / "all")
    rows = [json.loads(line) for line in (folder / "summary.jsonl").read_text().splitlines()]
    assert sorted(r["run_id"] for r in rows) == sorted(every)
    assert "0 point(s) measured twice" in (folder / "report.md").read_text()
    points = [
        {k: r.get(k) for k in ("run_id", "requests_failed", "failures_by_status", "error", "valid", "pruned", "throughput_rps")}
        for r in rows
    ]
    assert (folder / "best" / "config.properties").is_file(), points  # a point that meets the constraints is the best one
