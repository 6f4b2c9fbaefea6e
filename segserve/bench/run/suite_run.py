"""A whole suite run: the result folder, the points and their inputs, the loop, the bare-model measurement,
and the sinks that write what was measured."""

import os
import platform
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from segserve import ROOT
from segserve.archives.archive_urls import masked_text
from segserve.archives.catalog import FUSED_SUFFIX, Catalog
from segserve.bench.results.analysis import Pipeline, analyse
from segserve.bench.results.sinks import Export, FinishedRun, Plots, Report, RunsFolder, Summary, Terminal
from segserve.bench.results.store import read_runs
from segserve.bench.run.baselines import bare_throughputs
from segserve.bench.run.deploy import Deployment
from segserve.bench.run.point import resolve
from segserve.bench.run.runner import Runner
from segserve.bench.run.suite_inputs import SuiteInputs, digest
from segserve.bench.run.targets.best import Best
from segserve.bench.search import budget_points, candidates, make_strategy, study
from segserve.bench.suite import plan as planning
from segserve.bench.suite.params import node_param, workers_param
from segserve.bench.suite.spec import Suite
from segserve.engines.ray.cluster import Cluster
from segserve.errors import RuntimeFailure, UsageError
from segserve.machine.identity import differences, environment, int8_shortfall, label, machines_of


def check_rounds(suite: Suite, rounds: int, resume: Path | None, storage_url: str | None) -> None:
    """--rounds N measures a whole grid N times in alternating order: refused where that cannot be done."""
    if rounds < 1:
        raise UsageError(f"--rounds must be ≥ 1 (got {rounds})")
    if rounds == 1:
        return
    if suite.search.strategy != "grid" or suite.search.budget is not None:
        raise UsageError(
            f"--rounds {rounds}: measures every point in turn, so it needs a grid without a budget (this suite: {suite.search.strategy})"
        )
    if resume is not None or storage_url is not None:
        raise UsageError(f"--rounds {rounds}: a run in rounds is measured whole: no --resume or --storage")
    if suite.load.phases:
        raise UsageError(f"--rounds {rounds}: load phases are measured as they come, not in rounds")


def warn_about_machine(points, catalog: Catalog, kept: list[dict], env_info: dict, log) -> None:
    """Said before measuring: int8 points on a CPU without VNNI or AMX, and kept points (--resume) measured on
    another machine, whose numbers this run's would be mixed with."""
    shortfall = int8_shortfall(env_info.get("cpu_isa"), env_info.get("cpu_vendor"))
    int8 = [p for p in points if resolve(p, catalog).handler.get("optimize") == "int8"]
    if int8 and shortfall:
        log(f"warning: {len(int8)} int8 point(s) on this machine: {shortfall}")
    if over := oversubscribed(points, catalog, env_info.get("cpu_cores")):
        example, threads, workers = over[0]
        log(
            f"warning: {len(over)} point(s) ask for more torch threads than this process's {env_info['cpu_cores']} core(s) "
            f"(e.g. {example}: threads {threads} × {workers} worker(s)); they compete for the cores "
            "(threads 0 shares the cores among a model's live workers)"
        )
    elsewhere = [m for m in machines_of(kept) if differences(m, env_info)]
    if elsewhere:
        where = ", ".join(label(m) for m in elsewhere)
        log(f"warning: kept points were measured on {where}; this is {label(env_info)} (start anew to compare like with like)")


def oversubscribed(points, catalog: Catalog, cores: int | None) -> list[tuple[str, int, int]]:
    """(run_id, threads, workers) of each point whose weights node sets `threads` explicitly and whose workers of
    that node then run more torch threads than the cores this process may use."""
    found = []
    for point in points:
        node = weights_node(catalog, point.target)
        if not cores or node is None:
            continue
        threads = point.params.get(node_param(node, "threads")) or point.params.get("threads") or 0  # as the grid sets it
        workers = point.params.get(workers_param(node)) or point.params.get("workers") or 1
        if threads * workers > cores:
            found.append((point.run_id, threads, workers))
    return found


def weights_node(catalog: Catalog, name: str) -> str | None:
    """The name of the node of a catalog target that carries segserve's weights (seg), None for others."""
    target = catalog.targets.get(name)
    node = target.weights_node if target is not None else None
    return node.name if node is not None else None


def pipelines(catalog: Catalog, names: list[str]) -> dict[str, Pipeline]:
    """The suite's DAG targets with their members, and for a workflow the suite's target that serves it fused into
    one model: a catalog DAG's twin (`<dag>_fused`), or for a .war the name `segserve fuse` gives it (`fused_<war>`)."""
    result = {}
    for name in names:
        target = catalog.targets.get(name)
        if target is not None and not target.is_model:
            twins = (name + FUSED_SUFFIX, f"fused_{name}") if target.is_workflow else ()
            fused = next((twin for twin in twins if twin in names), None)
            result[name] = Pipeline(target.members, weights_node(catalog, name), fused)
    return result


def members_of(suite: Suite, catalog: Catalog) -> dict[str, dict[str, str]]:
    """Pipeline target → {node: its model}, for the pipelines of the suite whose every node's model the suite
    also serves alone (what the auto search predicts them from)."""
    listed = set(suite.target_names)
    members = {}
    for name in suite.target_names:
        target = catalog.targets.get(name)
        if target is None or target.is_model:
            continue
        nodes = {node.name: node.model.name for node in target.nodes}
        if set(nodes.values()) <= listed:
            members[name] = nodes
    return members


def strategy_for(suite: Suite, catalog: Catalog, points: list[planning.Point], storage=None):
    """The suite's search strategy; `storage`: the Optuna storage an optuna search keeps its study in."""
    search = suite.search
    constraints = suite.constraint_bounds
    return make_strategy(search, points, members_of(suite, catalog), suite.objectives, constraints, storage, suite.name)


def search_budget(suite: Suite, catalog: Catalog, points: list[planning.Point]) -> tuple[int, str]:
    """(the number of candidate points, what the budget allows in words); refuses a budget larger than the space."""
    search = suite.search
    space = candidates(points, members_of(suite, catalog))
    limit = budget_points(search.budget, len(space))
    if search.budget is None:
        return len(space), "none (the grid)"
    return len(space), f"{search.budget.minutes:g} minutes" if limit is None else f"{limit} points ({limit / len(space):.0%})"


def describe_search(suite: Suite, catalog: Catalog, points: list[planning.Point]) -> str:
    """The --dry-run line on the search: the space's size and what the budget allows."""
    search = suite.search
    space, allowed = search_budget(suite, catalog, points)
    if search.budget is None:
        return f"search: {search.strategy}, no budget: every one of the {len(points)} points"
    probes = sorted({m for nodes in members_of(suite, catalog).values() for m in nodes.values()})
    aside = f" ({', '.join(probes)} alone: measured only by auto, to predict the pipelines)" if probes else ""
    return f"search: {search.strategy} (seed {search.seed}) over {space} candidate points{aside}; budget {allowed}"


def plan_points(suite: Suite, catalog: Catalog, weights: Path) -> list[planning.Point]:
    """The points with the run ids a run will give them (--dry-run)."""
    return planning.expand(suite, catalog, SuiteInputs(suite, catalog, weights).digests())


def carries_weights(suite: Suite, catalog: Catalog) -> bool:
    """Whether a target of the suite is built from segserve's weights (archive and http targets are not)."""
    return any(weights_node(catalog, name) for name in suite.target_names)


def check_storage(suite: Suite, storage_url: str | None) -> None:
    if storage_url is not None and suite.search.strategy != "optuna":
        raise UsageError(f"--storage: only an optuna search keeps its trials in a study (this suite's search is {suite.search.strategy})")


def check_cluster(suite: Suite, cluster: Cluster | None) -> None:
    """--ray-address deploys the suite's Ray points onto a cluster: refused for a suite without one, and with
    `profile: best` (py-spy and the profiler's CPU sampling read this host's processes: not the nodes')."""
    if cluster is None:
        return
    if "ray" not in (suite.grid.server.engine or []):
        raise UsageError(
            f"--ray-address {cluster.address}: this suite has no Ray point to deploy there (add `engine: [ray]` under grid.server)"
        )
    if suite.profile == "best":
        raise UsageError(
            f"--ray-address {cluster.address}: profile: best samples this host's processes, not a cluster's nodes: leave it out"
        )


@dataclass(frozen=True)
class SuiteRun:
    """What `segserve bench SUITE` was asked: the suite, and where and how to measure it."""

    suite_path: Path
    suite: Suite
    catalog: Catalog
    results_root: Path
    weights: Path
    resume: Path | None = None  # a result folder to finish
    storage_url: str | None = None  # an Optuna study shared with other bench processes
    port_base: int | None = None
    heartbeat_s: int = study.HEARTBEAT_S
    exports: list | None = None
    rounds: int = 1
    fuse: object = None  # segserve fuse's fuse(): a .war's best point also as one .mar in best/fused/ (the command gives it)
    cluster: Cluster | None = None  # `--ray-address`: the suite's Ray points on a user's running Ray cluster


@dataclass
class Prepared:
    """A suite run checked and planned: nothing written, nothing started."""

    points: list[planning.Point]
    parts: dict[str, dict]  # target → what besides its parameters its measurement depends on
    inputs: SuiteInputs
    storage: object | None  # the shared study's storage, opened (so reachable); None without --storage


def prepare(run: SuiteRun) -> Prepared:
    """Every check a run makes before it writes a file or starts a server, and its points with their run ids:
    the dry run stops here."""
    check_rounds(run.suite, run.rounds, run.resume, run.storage_url)
    check_storage(run.suite, run.storage_url)
    check_cluster(run.suite, run.cluster)
    storage = study.open_storage(run.storage_url, None, run.heartbeat_s) if run.storage_url else None  # refused before anything starts
    if run.resume is not None and not (run.resume / "runs").is_dir():
        raise UsageError(f"--resume {run.resume}: not a result folder (no runs/ inside)")
    inputs = SuiteInputs(run.suite, run.catalog, run.weights)
    parts = {name: inputs.parts(name) for name in run.suite.target_names}
    points = planning.expand(run.suite, run.catalog, {name: digest(p) for name, p in parts.items()})
    return Prepared(points, parts, inputs, storage)


def run_suite(run: SuiteRun, log=print) -> Path:
    """Measure what the strategy proposes (skipping points already measured the same way with --resume) and
    hand every record to the sinks; return the result folder (RuntimeFailure, exit 1, when every point failed:
    the folder is written all the same). An optuna search keeps its study in storage_url
    (default: study.log in the result folder), which other bench processes may share."""
    if carries_weights(run.suite, run.catalog) and not run.weights.exists():  # a suite of a user's archives and endpoints needs none
        raise UsageError(f"{run.weights} is missing: run `segserve build` first (it trains the model)")
    prepared = prepare(run)
    out_dir = run.resume or run.results_root / run.suite.name / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    # as written, but no URL's credentials (an archive's user:password, a presigned query): results get exported
    (out_dir / "suite.yaml").write_text(masked_text(run.suite_path.read_text()))
    records, changes, sinks, env_info = _measure(run, prepared, out_dir, log)
    return _finish(run, prepared, out_dir, records, changes, sinks, env_info, log)


def _strategy(run: SuiteRun, prepared: Prepared, out_dir: Path, log):
    """The run's strategy; an optuna search's study in the shared storage, else in the result folder."""
    suite, storage = run.suite, prepared.storage
    own_study = suite.search.strategy == "optuna" and storage is None
    if own_study:
        storage = study.open_storage(None, out_dir)
    strategy = strategy_for(suite, run.catalog, prepared.points, storage)
    if own_study:
        strategy.abandon_running()  # what a killed run of this folder left running (--resume)
    elif storage is not None:
        strategy.reseed(os.getpid())  # a shared study: other processes ask it too
    if (kept := strategy.kept_study()) is not None:
        study.save_suite(kept, run.suite_path)
        log(f"study {kept.study_name!r} in {study.display_url(run.storage_url or str(out_dir / study.STUDY_FILE))}")
    return strategy


def _measure(run: SuiteRun, prepared: Prepared, out_dir: Path, log):
    """The points measured, each record handed to the sinks as it comes: (records, what the points cost the
    deployment (restarts, registrations, scales), sinks, environment)."""
    suite, catalog, points, parts = run.suite, run.catalog, prepared.points, prepared.parts
    env_info = environment(ROOT)  # segserve's own checkout: the code that measured, wherever the suite runs from
    strategy = _strategy(run, prepared, out_dir, log)
    done = read_runs(out_dir)
    kept = [done[p.run_id] for p in points if p.run_id in done and not done[p.run_id].get("error")]
    if done:
        log(f"resuming: {len(kept)} of {len(points)} points already measured the same way")
        older = sorted({r["environment"]["git_sha"] for r in kept} - {env_info["git_sha"]})
        if older:
            log(f"note: kept points were measured with code {', '.join(older)}; this is {env_info['git_sha']} (start anew to measure it)")
    if suite.search.budget is None and suite.search.strategy == "grid":
        log(planning.describe(suite, points).splitlines()[-1])
    else:  # the grid's totals would mislead: say what the search may measure
        log(describe_search(suite, catalog, points))
    sinks = [RunsFolder(out_dir), Summary(), Report(), Plots(), Best(catalog, log, run.fuse), Terminal(log)]
    if run.exports:
        sinks.append(Export(run.exports, log))  # last: it sends the files the others wrote
    measured_by = f"{platform.node()}:{os.getpid()}"  # which bench process (a shared study has several)
    # its servers stop as the measuring ends: the analysis, the sinks and the profile run on a quiet machine
    with Deployment(suite, catalog, run.weights, log, port_base=run.port_base, cluster=run.cluster) as deployment:
        prepared.inputs.capture = deployment.torchserve.answers
        runner = Runner(catalog, deployment, strategy, sinks, prepared.inputs.bodies_for, log)
        warn_about_machine(points, catalog, kept, env_info, log)

        def base(point) -> dict:
            record = {"environment": env_info, "setup": parts[point.target], "measured_by": measured_by}
            return record | deployment.kind_of(point.target).record_keys(point.target)

        records = runner.run_rounds(run.rounds, base) if run.rounds > 1 else runner.run(done, base)
    return records, deployment.changes, sinks, env_info


def _finish(run: SuiteRun, prepared: Prepared, out_dir: Path, records: list[dict], changes: dict, sinks, env_info: dict, log) -> Path:
    """The bare forward at the suite's end, the analysis and every sink's last word (report, plots, best/,
    exports), and the profile."""
    suite, catalog, points = run.suite, run.catalog, prepared.points
    bare = bare_throughputs(records, run.weights, lambda name: weights_node(catalog, name), log, suite.load)
    finish_run(out_dir, suite, catalog, points, records, bare, env_info, sinks, changes)
    if suite.profile == "best":
        profile_best(suite, catalog, run.weights, records, points, prepared.inputs, out_dir, run.port_base, log, run.cluster)
    if records and all(r.get("error") for r in records):  # written down, but not a measurement: exit 1, not 0
        raise RuntimeFailure(f"every point of this run failed (the first: {records[0]['error']}); results: {out_dir}")
    return out_dir


def finish_run(
    out_dir: Path, suite: Suite, catalog: Catalog, points, records: list[dict], bare: list[dict], env_info: dict, sinks, search: dict
) -> None:
    """The end of a run, written once for `bench` and `bench collect`: the records analysed (constraints,
    objectives, pipelines' efficiency against `bare`, the bare forward's entries), what the search did (`search`:
    beside the strategy, its budget and counts), and every sink's last word."""
    swept = planning.swept(points)
    analysis = analyse(
        records, suite.constraint_bounds, suite.objective, bare, pipelines(catalog, suite.target_names), suite.objectives, swept
    )
    space, allowed = search_budget(suite, catalog, points)
    pruned = sum(1 for r in records if r.get("pruned"))
    searched = {"strategy": suite.search.strategy, "budget": allowed, "candidates": space, "measured": len(records), "pruned": pruned}
    finished = FinishedRun(out_dir, suite, records, swept, bare, analysis, env_info, searched | search)
    for sink in sinks:
        sink.finish(finished)


def profile_best(
    suite, catalog: Catalog, weights: Path, records: list[dict], points: list, inputs, out_dir: Path, port_base, log, cluster=None
) -> None:
    """`profile: best`: the suite's best point of ours served again and profiled under its own load
    (segserve/bench/run/profiler.py), and beside it the best command target's (a peer server: every process of
    it, py-spy on the Python ones); each profile's summary is appended to report.md."""
    from segserve.bench.suite.columns import best

    constraints = suite.constraint_bounds
    kinds = (("the best point", catalog.targets), ("the best command target", suite.command_targets))
    for what, targets in kinds:
        winner = best([r for r in records if r.get("target") in targets], constraints, suite.objective)
        if winner is None:
            if targets is catalog.targets or any(r.get("target") in targets for r in records):
                log(f"profile: best: no {what.removeprefix('the best ')} satisfied the constraints: nothing to profile")
            continue
        point = next(p for p in points if p.run_id == winner["run_id"])
        log(f"profiling {what} {point.run_id} for {suite.profile_seconds:.0f}s …")
        summary = _profile_point(suite, catalog, weights, point, inputs, out_dir, (port_base, cluster), log)
        folder = Path(summary["folder"])
        text = (folder / "report.md").read_text().replace("# Profile of", f"## Profile of {what}:", 1)
        with open(out_dir / "report.md", "a") as report:
            report.write(f"\n{text}\nFiles: `{folder.relative_to(out_dir)}/`\n")
        log(f"profile of {point.run_id}: {folder}")


def _profile_point(suite, catalog: Catalog, weights: Path, point, inputs, out_dir: Path, where: tuple, log) -> dict:
    """Deploy one point again (its own server; where: (port_base, cluster)) and profile it under its suite's connections."""
    from segserve.bench.run import profiler
    from segserve.bench.run.load import LoadSpec

    port_base, cluster = where
    with Deployment(suite, catalog, weights, log, port_base=port_base, cluster=cluster) as deployment:
        inputs.capture = deployment.torchserve.answers
        bodies = inputs.bodies_for(point.target)  # before the deploy: a member's capture releases what is registered
        endpoint = deployment.deploy(point)
        connections = point.params.get("concurrency") or 8
        seconds, out = suite.profile_seconds, out_dir / "profile"
        warm_s = suite.load.warmup_s + suite.load.fresh_workers_warmup_s  # a server started for the profile: fresh
        if point.target in catalog.targets and point.engine == "torchserve":  # TorchServe's metrics and workers' stacks
            server = deployment.torchserve.server
            target = catalog.targets[point.target]
            return profiler.profile(server, target, server.run_dir, seconds, out, bodies, connections, 100, log, warm_s)
        spec = LoadSpec(endpoint.url, endpoint.path, bodies, endpoint.token, connections, headers=endpoint.headers)
        return profiler.record(point.target, deployment.watched_processes(endpoint), spec, seconds, out, 100, log, None, warm_s)


@dataclass(frozen=True)
class CollectRun:
    """`segserve bench collect STUDY`'s options."""

    study: str  # the study's name (with storage_url), or a result folder (its study.log) or a journal file
    storage_url: str | None
    catalog: Catalog
    results_root: Path


def collect(run: CollectRun, log=print) -> Path:
    """`segserve bench collect STUDY`: one result folder (runs/, summary, report, best/) from every point the
    study's processes measured. Without --storage, STUDY is a result folder (its study.log) or a journal file."""
    import optuna

    name, storage_url, catalog, results_root = run.study, run.storage_url, run.catalog, run.results_root

    if storage_url is None:
        path = Path(name)
        journal = path / study.STUDY_FILE if path.is_dir() else path
        if not journal.is_file():
            raise UsageError(f"{name}: neither a result folder with a {study.STUDY_FILE} nor a study journal (or give --storage URL)")
        storage = study.open_storage(str(journal), None)
        names = optuna.get_all_study_names(storage)
        if len(names) != 1:
            raise UsageError(f"{journal}: holds {len(names)} studies ({', '.join(names)}): give --storage {journal} and the study's name")
        name = names[0]
    else:
        storage = study.open_storage(storage_url, None)
    try:
        found = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        known = ", ".join(optuna.get_all_study_names(storage)) or "none"
        raise UsageError(f"no study {name!r} in {study.display_url(storage_url or name)} (studies: {known})") from None
    if "suite_yaml" not in found.user_attrs:
        raise UsageError(f"study {name!r} was not written by segserve bench (it has no suite)")
    records = study.study_records(found)
    if not records:
        raise UsageError(f"study {name!r} has no measured point yet")
    out_dir = results_root / name / (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-collected")
    out_dir.mkdir(parents=True)
    (out_dir / "suite.yaml").write_text(found.user_attrs["suite_yaml"])
    from segserve.bench.suite.spec import load_suite

    suite = load_suite(out_dir / "suite.yaml", catalog)
    points = planning.expand(suite, catalog)
    by_process = dict(Counter(record.get("measured_by", "?") for record in records))
    measured = [t.user_attrs["record"]["run_id"] for t in found.get_trials(deepcopy=False) if "record" in t.user_attrs]
    duplicates = len(measured) - len(set(measured))
    sinks = [RunsFolder(out_dir), Summary(), Report(), Plots(), Best(catalog)]
    for record in records:
        for sink in sinks:
            sink.add(record)
    measured_by = {"by_process": by_process, "duplicates": duplicates}
    finish_run(out_dir, suite, catalog, points, records, [], records[0].get("environment", {}), sinks, measured_by)
    processes = ", ".join(f"{who}: {count}" for who, count in sorted(by_process.items()))
    log(
        f"collected {len(records)} point(s) of study {name!r} from {len(by_process)} process(es) ({processes}); {duplicates} measured twice"
    )
    log(f"results: {out_dir}")
    return out_dir
