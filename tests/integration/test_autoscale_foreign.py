"""`segserve autoscale` on a user's own workflow (#28): two nodes whose handlers never import segserve, one of them
sleeping, registered on a real TorchServe as the user built them. The autoscaler sees only TorchServe's metrics
(queue and inference microseconds, the management API's workers and batch size, the workers' CPU) and still finds
the node that holds the requests: the sleep makes the imbalance deterministic, so nothing here asserts a timing."""

import json

import pytest

from segserve.archives.foreign import read_archive
from segserve.autoscale.loop import Autoscaler, war_bounds
from segserve.autoscale.rules import Policy
from segserve.bench.run.profiler import Background, torchserve_load
from segserve.cli import main
from segserve.serving.server import TorchServe
from tests.conftest import ROOT
from tests.system.test_foreign_archives import model_archive, workflow_archive

FAST, SLOW = "flow__fast", "flow__slow"

PASS_ON = """
def handle(data, context):
    if data is None:  # TorchServe's load-time call
        return None
    return [bytes(row.get("data") or row.get("body")) for row in data]
"""

SLEEPS = """
import time


def handle(data, context):
    if data is None:
        return None
    time.sleep(0.05 * len(data))  # waits, as on I/O or a device: its worker is busy with little CPU
    return [bytes(row.get("data") or row.get("body")) for row in data]
"""


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """flow.war (fast → slow) built with the official archivers and registered on a TorchServe of its own, one
    worker per node; the spec lets each node have 1 to 2."""
    store = tmp_path_factory.mktemp("user_store")
    model_archive(store, "fast", PASS_ON)
    model_archive(store, "slow", SLEEPS)
    workflow_archive(
        store,
        "flow",
        """
            models:
              batch-size: 1
              timeout-ms: 2000  # a dropped answer (TorchServe 0.12, docs/serving.md) asked again soon, not after the default
              retry-attempts: 3
              fast: {url: fast.mar, min-workers: 1, max-workers: 2}
              slow: {url: slow.mar, min-workers: 1, max-workers: 2}
            dag:
              fast: [slow]
            """,
    )
    server = TorchServe(
        run_dir=tmp_path_factory.mktemp("ts_user"), model_store=store, config_template=ROOT / "config.properties", free_ports=True
    )
    with server:  # stopped by process id however the tests end
        server.register_workflow("flow.war", "flow")
        for node in (FAST, SLOW):
            server.scale(node, 1)
        yield server, store / "flow.war"


def load(server) -> Background:
    """4 connections on /wfpredict/flow, loopback, until finish(): the slow node's one worker cannot keep up."""
    background = Background(torchserve_load(server, "/wfpredict/flow", [b"x" * 64], 4), 90)
    background.start()
    return background


def test_autoscale_on_a_war_logs_what_torchserve_saw_of_each_node(flow, capsys):
    server, war = flow
    background = load(server)
    try:
        command = ["autoscale", "--run-dir", str(server.run_dir), "--config", str(ROOT / "config.properties"), "--war", str(war)]
        code = main([*command, "--dry-run", "--interval-s", "1", "--intervals", "2"])
    finally:
        result = background.finish()
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"autoscaling {FAST}, {SLOW} within" in out and "(dry run)" in out
    records = [json.loads(line) for line in (server.run_dir / "autoscale.jsonl").read_text().splitlines()][-2:]
    for record in records:
        fast, slow = (
            {k: m[k] for k in ("source", "served_rps", "stages_ms", "busy_workers", "waiting_batches")} for m in record["metrics"]
        )
        # no handler counters and no request count: said as unknown, not as zeros; the sleeping node holds its worker
        assert fast["source"] == slow["source"] == "torchserve" and slow["served_rps"] is None and slow["stages_ms"] == {}
        assert slow["busy_workers"] > fast["busy_workers"] and slow["waiting_batches"] > 0, record["metrics"]
        assert record["applied"] is False and record["error"] is None and record["why"]
    assert all(200 <= status < 300 for status in result.status), result.status_counts()


def test_the_sleeping_node_takes_a_worker_from_torchserves_metrics_alone(flow, tmp_path):
    server, war = flow
    bounds = war_bounds(read_archive("flow", str(war), None))
    # a budget of 3 workers: with one worker per node at least, this 2-core machine's budget leaves nothing to move
    scaler = Autoscaler(server, bounds, Policy(budget_workers=3, min_interval_s=0), tmp_path)
    background, records = load(server), []
    try:
        for _ in range(12):  # a move under load can be refused by TorchServe's scale race: it is tried again
            background.span(1.5)
            records.append(scaler.step())
            if records[-1]["applied"]:
                break
        workers = {node: len(server.describe(node)["workers"]) for node in (FAST, SLOW)}
    finally:
        result = background.finish()
        for node in (FAST, SLOW):
            server.scale(node, 1)
    print(*[(r["move"], r["why"]) for r in records], sep="\n")  # shown with -s: what it saw and did
    moves = [r for r in records if r["applied"]]
    assert moves and [list(step) for step in moves[0]["move"]] == [[SLOW, 2]], records
    assert moves[0]["why"].startswith(f"{SLOW} takes a worker"), moves[0]["why"]
    assert workers == {FAST: 1, SLOW: 2}
    assert all(200 <= status < 300 for status in result.status), result.status_counts()
