"""`segserve bench ab SUITE --a REF --b REF`: did a change slow the pipeline? Two versions of the project (git
refs, checked out as worktrees, or folders) each get their own TorchServe; every point of the suite is
measured A B, B A, A B … in turn, so a slow spell of the machine falls on both, with fresh workers on both sides
each round; then each point's change is the mean of its rounds' B ÷ A (one round: its windows, as `bench compare`
does) and the suite's the mean of its points'. Exit 1 only on a detected slowdown of B.
"""

import json
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from segserve import ROOT
from segserve.archives.catalog import Catalog
from segserve.bench.results.compare import Change, overall_change, paired_change, throughput_change
from segserve.bench.results.render import render_table
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.load import LoadSpec, run_load
from segserve.bench.run.point import PointMeasurement, resolve
from segserve.bench.run.rounds import in_rounds
from segserve.bench.run.suite_inputs import SuiteInputs
from segserve.bench.suite import plan as planning
from segserve.bench.suite.spec import Suite
from segserve.errors import RuntimeFailure, UsageError
from segserve.machine.identity import label, machine

WARM_UP_S = 2.0  # of load on each side before the first round


COST_COLUMNS = (
    "server_cpu_ms_per_request",
    "frontend_cpu_ms_per_request",
    "workers_cpu_ms_per_request",
    "client_cpu_ms_per_request",
    "worker_outside_forward_ms",
    "worker_forward_ms",
)


def checkout(root: Path, ref: str, into: Path, log=print) -> tuple[Path, bool]:
    """(the project folder of REF, whether it is a worktree made here): a folder as it is, else a git worktree."""
    if Path(ref).is_dir():
        return Path(ref).resolve(), False
    done = subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(into), ref], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"{ref!r} is neither a folder nor a git ref of {root}: {done.stderr.strip().splitlines()[-1]}")
    log(f"{ref}: worktree {into}")
    return into, True


def project_root(here: Path) -> Path:
    """The checkout whose git refs --a and --b name: the folder run from when it is a segserve project, else the
    segserve that runs (a user who benchmarks archives of their own runs from their archives' folder)."""
    return here if (here / "segserve" / "__init__.py").is_file() else ROOT


class SideCatalog(Catalog):
    """A version's catalog, with the suite's archive targets (read, their paths resolved, in the folder run from):
    a user's archives are the same files on both sides, whichever version registers them. So is a user's own
    config.properties in that folder, as `segserve bench` run there uses it; without one, each version's own."""

    def __init__(self, folder: Path, foreign: list, config: Path | None = None):
        super().__init__(folder)
        self.add_foreign(foreign)
        self.config = config

    @property
    def config_template(self) -> Path:
        return self.config or super().config_template


def users_config(here: Path, root: Path) -> Path | None:
    """The config.properties of the folder run from when that folder is not the project compared."""
    own = here / "config.properties"
    return own if here.resolve() != root.resolve() and own.is_file() else None


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--b-env {item!r}: give NAME=VALUE")
        env[name] = value
    return env


def warm_up(sides: dict[str, Deployment], point, suite: Suite, bodies: list[bytes], log) -> None:
    """Start both servers at once, then load each with the first point for a
    while: measured without it, the run's very first measurement came out 20% low (59 against about 75 req/s, seg at 16 connections)."""
    with ThreadPoolExecutor(len(sides)) as pool:  # the servers start at once; the archives are built one side at a time
        list(pool.map(lambda deployment: deployment.torchserve.ensure_server(point), sides.values()))
    for endpoint in [deployment.deploy(point) for deployment in sides.values()]:
        concurrency = point.params.get("concurrency", suite.load.max_connections)
        run_load(LoadSpec(endpoint.url, endpoint.path, bodies, endpoint.token, concurrency, headers=dict(endpoint.headers)), WARM_UP_S)
    log(f"warmed up: {WARM_UP_S:.0f} s of {point.run_id} on A and on B")


@dataclass(frozen=True)
class AbRun:
    """What `segserve bench ab` was asked: a suite, the two versions, how many rounds and what counts as a change."""

    suite: Suite
    root: Path  # the checkout whose git refs `refs` names
    refs: tuple[str, str]  # A and B: git refs or folders
    weights: Path
    results_root: Path
    rounds: int = 1
    min_effect: float = 0.05
    b_env: dict = field(default_factory=dict)  # B's server's environment (--b-env)
    foreign: list = field(default_factory=list)  # the suite's archive targets as load_suite read them, members too


def run_ab(ab: AbRun, log=print) -> tuple[Path, bool]:
    """Both versions measured in turn over the suite's points; (the result folder, whether B is slower)."""
    config = users_config(Path.cwd(), ab.root)
    if ab.rounds < 1:
        raise UsageError(f"--rounds must be ≥ 1 (got {ab.rounds})")
    if ab.suite.outside_targets:
        names = ", ".join(ab.suite.outside_targets)
        raise UsageError(f"bench ab deploys both versions itself: http and command targets ({names}) cannot be compared")
    work = Path(tempfile.mkdtemp(prefix="segserve-ab-"))
    sides, worktrees = {}, []
    try:
        for name, ref in zip("ab", ab.refs, strict=True):
            folder, made = checkout(ab.root, ref, work / name, log)
            worktrees += [folder] if made else []
            catalog = SideCatalog(folder, ab.foreign or [], config)
            sides[name] = Deployment(ab.suite, catalog, ab.weights, lambda _: None, env=ab.b_env if name == "b" else None)
        points, bodies = _points_and_bodies(ab, sides, log)
        warm_up(sides, points[0], ab.suite, bodies.bodies_for(points[0].target), log)
        measured = _measure_in_turn(ab, sides, points, bodies, log)
    finally:
        for deployment in sides.values():
            deployment.close()
        for folder in worktrees:
            subprocess.run(["git", "-C", str(ab.root), "worktree", "remove", "--force", str(folder)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    rows, changes = [], []
    for point in points:
        row, change = _point_row(point, measured, ab)
        rows.append(row)
        changes.append(change)
    return _report(ab, rows, changes, log)


def _points_and_bodies(ab: AbRun, sides: dict[str, Deployment], log) -> tuple[list, SuiteInputs]:
    """The suite's points (planned on A's catalog) and their request bodies, every one made before any deploy."""
    catalog = sides["a"].catalog
    points = planning.expand(ab.suite, catalog, SuiteInputs(ab.suite, catalog, ab.weights).digests())
    log(f"{len(points)} point(s) × {ab.rounds} round(s) × A and B, interleaved")
    bodies = SuiteInputs(ab.suite, catalog, ab.weights)
    bodies.capture = sides["a"].torchserve.answers
    for point in points:  # before any deploy: a workflow member's capture releases what is registered
        bodies.bodies_for(point.target)
    return points, bodies


def _measure_in_turn(ab: AbRun, sides: dict[str, Deployment], points: list, bodies: SuiteInputs, log) -> dict:
    """Every point on A and on B in turn, round after round (rounds.in_rounds: A B, B A, …, the points reversed
    every other round, fresh workers on both sides each round); {(run_id, side): each round's record}."""
    units = {name: PointMeasurement(deployment, ab.suite.load, bodies.bodies_for) for name, deployment in sides.items()}
    resolved = {(point.run_id, name): resolve(point, sides[name].catalog) for point in points for name in sides}  # once

    def measure(point, name: str) -> dict:
        record = units[name].measure(resolved[(point.run_id, name)])
        if record["error"]:  # a side that cannot be measured leaves nothing to compare
            raise RuntimeFailure(f"{point.run_id} on {name.upper()}: {record['error']}")
        cost = record.get("server_cpu_ms_per_request")
        cost_text = f", server {cost:.2f} CPU-ms a request" if cost is not None else ""
        which = f"round {len(measured.get((point.run_id, name), [])) + 1} {point.run_id} {name.upper()}"
        log(f"  {which}: {record['throughput_rps']:.1f} req/s{cost_text} (deployed in {record['reconfigure_s']:.1f} s)")
        return record

    def release() -> None:
        for deployment in sides.values():
            deployment.release()

    measured: dict = {}
    return in_rounds(points, ab.rounds, measure, release, ("a", "b"), measured)


def _point_row(point, measured: dict, ab: AbRun) -> tuple[dict, Change]:
    """A point's row of the summary and its change, B ÷ A."""
    a_records, b_records = measured[(point.run_id, "a")], measured[(point.run_id, "b")]
    a, b = ([w for r in records for w in r["measured_window_throughputs_rps"]] for records in (a_records, b_records))
    a_rounds, b_rounds = [r["throughput_rps"] for r in a_records], [r["throughput_rps"] for r in b_records]
    # paired by round when there are rounds to pair; one round: its windows, as `bench compare` does
    change = paired_change(a_rounds, b_rounds, ab.min_effect) if ab.rounds > 1 else throughput_change(a, b, ab.min_effect)
    row = {
        "run_id": point.run_id,
        "params": " ".join(f"{k}={v}" for k, v in point.params.items()),
        "a_rps": sum(a_rounds) / len(a_rounds),
        "b_rps": sum(b_rounds) / len(b_rounds),
        "change": change.change,
        "change_uncertain": change.uncertain() and f"B ÷ A {change.uncertain()}",
        "change_ci_low": change.low,
        "change_ci_high": change.high,
        "verdict": change.verdict,
        "a_rounds_rps": a_rounds,
        "b_rounds_rps": b_rounds,
        "a_windows_rps": a,
        "b_windows_rps": b,
        # what a request cost each round (ms): the server's CPU by process, the client's, the handlers' stages
        "a_rounds_cost_ms": {column: [r.get(column) for r in a_records] for column in COST_COLUMNS},
        "b_rounds_cost_ms": {column: [r.get(column) for r in b_records] for column in COST_COLUMNS},
    }
    return row, change


def _report(ab: AbRun, rows: list[dict], changes: list[Change], log) -> tuple[Path, bool]:
    """Write ab.json and print the table and the overall change; (the result folder, whether B is slower)."""
    overall = overall_change(changes, ab.min_effect)
    slower = overall.verdict == "slower"
    here = machine()
    out_dir = ab.results_root / ab.suite.name / ("ab-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {
        "a": ab.refs[0],
        "b": ab.refs[1],
        "b_env": ab.b_env,
        "rounds": ab.rounds,
        "min_effect": ab.min_effect,
        "machine": {"label": label(here), **here},  # A and B on this one machine, in turn
        "overall": {"change": overall.change, "ci_low": overall.low, "ci_high": overall.high, "verdict": overall.verdict},
        "slower": slower,
        "points": rows,
    }
    (out_dir / "ab.json").write_text(json.dumps(summary, indent=2) + "\n")
    # a change is printed as a number only when its interval is within ±15% of B ÷ A (stats.uncertainty)
    shown = [{**row, "change": None if row["change_uncertain"] else row["change"]} for row in rows]
    log(render_table(shown, ["run_id", "params", "a_rps", "b_rps", "change", "change_ci_low", "change_ci_high", "verdict"]))
    log(f"A and B were measured in turn on one machine: {label(here)}")
    log(f"overall, B vs A over {len(changes)} point(s): {overall.text()} (min effect {ab.min_effect:.0%}); {out_dir / 'ab.json'}")
    return out_dir, slower
