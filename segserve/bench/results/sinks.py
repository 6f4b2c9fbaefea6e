"""Where a run's records go: each output is one writer, fed the same records as they are measured (`add`) and
the finished run once (`finish`). A new output (an exporter) is a new class here; the runner does not change.
"""

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from segserve.archives import registration
from segserve.archives.catalog import Catalog
from segserve.archives.registration import REGISTRATIONS, workflow_entry
from segserve.bench.results.analysis import Analysis
from segserve.bench.results.manifests import served_foreign, served_fused, write_manifests
from segserve.bench.results.plots import plot_by_param, plot_name, plot_pareto
from segserve.bench.results.render import terminal_summary
from segserve.bench.results.report import write_report
from segserve.bench.results.store import write_pipelines, write_summary
from segserve.bench.suite.columns import Record
from segserve.bench.suite.spec import Suite
from segserve.errors import RuntimeFailure, UsageError
from segserve.machine.identity import label
from segserve.serving.ts_config import render_config


def registration_of(chosen: dict, prefix: str = "") -> dict:
    """The registration values of a record ({name: value}), DAG-wide or of one node (prefix `<node>_`)."""
    return {name: chosen[prefix + name] for name in REGISTRATIONS if chosen.get(prefix + name) is not None}


@dataclass
class FinishedRun:
    out_dir: Path
    suite: Suite
    records: list[dict]
    swept: list[str]
    bare: list[dict]
    analysis: Analysis
    environment: dict
    search: dict = field(default_factory=dict)  # strategy, budget, candidates, measured; restarts, registrations, scales

    @property
    def constraints(self) -> dict:
        return {k: v.model_dump(exclude_none=True) for k, v in self.suite.constraints.items()}


class Sink:
    def add(self, record: Record) -> None:
        pass

    def finish(self, run: FinishedRun) -> None:
        pass


class RunsFolder(Sink):
    """runs/<run_id>.json as soon as a point is measured (what --resume keeps), and bare.json."""

    def __init__(self, out_dir: Path):
        self.runs_dir = out_dir / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)

    def add(self, record: Record) -> None:
        (self.runs_dir / f"{record['run_id']}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")

    def finish(self, run: FinishedRun) -> None:
        (run.out_dir / "bare.json").write_text(json.dumps(run.bare, indent=2) + "\n")


class Summary(Sink):
    """The machine-readable tables: summary.csv and summary.jsonl (one row per point), pipelines.jsonl (one row
    per pipeline of the report's efficiency table)."""

    def finish(self, run: FinishedRun) -> None:
        write_summary(run.out_dir, run.records, run.swept)
        write_pipelines(run.out_dir, run.analysis.efficiency)


class Report(Sink):
    def finish(self, run: FinishedRun) -> None:
        constraints, suite = run.constraints, run.suite
        write_report(
            run.out_dir, suite.name, run.records, run.swept, constraints, suite.objective, run.analysis, run.environment, run.search
        )


class Plots(Sink):
    """plots/: throughput vs p99 per target, best throughput by each swept parameter (the report links them)."""

    def finish(self, run: FinishedRun) -> None:
        plots_dir = run.out_dir / "plots"
        plots_dir.mkdir(parents=True, exist_ok=True)
        records, targets = run.records, run.analysis.targets
        for target in targets:
            measured = [r for r in records if r.get("target") == target and not r.get("error")]
            plot_pareto(plots_dir / plot_name("throughput_vs_p99", target), target, measured, run.analysis.winners[target])
        for param in (p for p in run.swept if p != "target"):
            plot_by_param(plots_dir / plot_name("throughput_by", param), param, records, targets)


class Best(Sink):
    """best/config.properties and best/<dag>.yaml from the best workflow or fused point (else any target's); for an
    archive target also its register.sh and the manifests to run it in a cluster (manifests.py)."""

    def __init__(self, catalog: Catalog, log=print, fuse=None):
        # fuse(war, model_store, out, log) → the fused .mar (segserve/fuse/, given by the command: a layer above this)
        self.catalog, self.log, self.fuse = catalog, log, fuse

    def finish(self, run: FinishedRun) -> None:
        winners = run.analysis.winners
        # a workflow's best first, then a fused twin's, then a model's; an http or command target's never (not ours)
        ours = sorted((name for name in winners if name in self.catalog.targets), key=lambda name: self.catalog.targets[name].best_rank)
        chosen = next((winners[name] for name in ours if winners[name]), None)
        if chosen is None:
            return
        best_dir = run.out_dir / "best"
        best_dir.mkdir(exist_ok=True)
        overrides = {"number_of_netty_threads": str(chosen["netty_threads"])} if chosen.get("netty_threads") else {}
        render_config(self.catalog.config_template, best_dir / "config.properties", overrides)
        # best for the machine it was measured on: int8 that wins with VNNI loses without it
        machine = chosen.get("environment") or run.environment
        on = f"# Best on: {label(machine)}; on another machine, measure again (best/machine.json)."
        (best_dir / "machine.json").write_text(json.dumps({"label": label(machine), **machine}, indent=2) + "\n")
        note = f"# Best point of this suite: {chosen['run_id']} ({chosen['target']}, {chosen['throughput_rps']:.1f} req/s).\n{on}"
        if chosen.get("omp_num_threads"):
            note += f"\n# Start TorchServe with OMP_NUM_THREADS={chosen['omp_num_threads']} in its environment (workers inherit it)."
        text = (best_dir / "config.properties").read_text()
        (best_dir / "config.properties").write_text(note + "\n" + text)
        target = self.catalog.targets[chosen["target"]]
        foreign = self.catalog.foreign.get(target.name)
        if foreign is not None:
            self.foreign_best(best_dir, chosen, target, foreign, on)
            for refused in write_manifests(best_dir, chosen, served_foreign(target, foreign, chosen), on, run.suite.core_plan):
                self.log(refused)  # the rest of best/ stays
            if foreign.is_workflow and self.fuse is not None:
                self.fused_best(best_dir, chosen, target, foreign, on, run.suite.core_plan)
            return
        if target.dag is None:
            return
        dag = self.catalog.dags[target.dag]
        spec = yaml.safe_load(dag.spec_path.read_text())
        # DAG-wide, then each node's own (a node's param is <node>_<param>), as the point's .war had them
        spec["models"].update(workflow_entry(registration_of(chosen)))
        for node in dag.nodes:
            workers = chosen.get(f"{node}_workers") or chosen["workers"]
            spec["models"][node].update(workflow_entry(registration_of(chosen, f"{node}_"), workers))
        header = f"# From {chosen['run_id']} ({chosen['target']}).\n{on}\n"
        (best_dir / f"{dag.name}.yaml").write_text(header + yaml.safe_dump(spec, sort_keys=False))

    def fused_best(self, best_dir: Path, chosen: dict, target, foreign, on: str, core_plan) -> None:
        """A .war's best point as one .mar that KServe can serve (`segserve fuse`), with its k8s and KServe manifests,
        in best/fused/; or best/fused.txt saying why its workflow cannot be fused."""
        fused_dir = best_dir / "fused"
        name = f"fused_{target.name}"
        try:
            fused_dir.mkdir(exist_ok=True)
            mar = self.fuse(foreign.path, foreign.model_store, fused_dir / f"{name}.mar", log=lambda _: None)
        except (UsageError, RuntimeFailure) as why:  # a node it cannot fuse, or the archiver failing on it
            shutil.rmtree(fused_dir, ignore_errors=True)
            (best_dir / "fused.txt").write_text(f"{target.name}.war cannot be fused into one .mar, so KServe cannot serve it: {why}\n")
            self.log(f"best/: no fused .mar of {target.name}.war: {why}")
            return
        shutil.copy(best_dir / "config.properties", fused_dir / "config.properties")
        notes = (
            f"{mar.name}: `segserve fuse {target.name}.war` (every node in one worker); the workflow was measured, not it:",
            f"measure it with an archive target {{name: {name}, archive: best/fused/{mar.name}}} before relying on its rate",
        )
        served = served_fused(name, mar, chosen, target.nodes[0].name)
        for refused in write_manifests(fused_dir, chosen, served, on, core_plan, notes=notes):
            self.log(refused)

    @staticmethod
    def foreign_best(best_dir, chosen: dict, target, foreign, on: str) -> None:
        """A user's archive at its best point: the management API calls that register it so (best/register.sh),
        and for a .war its spec with each node's values written in (best/<name>.yaml, to archive again)."""

        def value(node: str, param: str):
            return chosen.get(f"{node}_{param}", chosen.get(param))

        header = f"# From {chosen['run_id']} ({chosen['target']}).\n{on}\n"
        management = "${TS_MANAGEMENT:-http://127.0.0.1:8081}"
        if not foreign.is_workflow:
            query = f"url={foreign.path.name}&model_name={target.name}&initial_workers={chosen['workers']}&synchronous=true"
            query += registration.query(registration_of(chosen))
            calls = [f'curl -fsS -X POST "{management}/models?{query}"']
            workers = chosen["workers"]
            calls.append(f'curl -fsS -X PUT "{management}/models/{target.name}?{registration.scale_query(workers)}"')
        else:
            nodes = {}
            for node in foreign.nodes:
                values = {name: value(node, name) for name in REGISTRATIONS}
                nodes[node] = workflow_entry(values, value(node, "workers"))
            (best_dir / f"{target.name}.yaml").write_text(header + yaml.safe_dump(foreign.spec_with(nodes), sort_keys=False))
            calls = [
                f"# archive best/{target.name}.yaml with your handler into {target.name}.war (torch-workflow-archiver --spec-file), then:",
                f'curl -fsS -X POST "{management}/workflows?url={target.name}.war&workflow_name={target.name}"',
            ]
        script = (
            "#!/bin/sh\n"
            + header
            + "# TS_MANAGEMENT: the management API (default http://127.0.0.1:8081)\nset -e\n"
            + "\n".join(calls)
            + "\n"
        )
        (best_dir / "register.sh").write_text(script)


class Terminal(Sink):
    def __init__(self, log=print):
        self.log = log

    def finish(self, run: FinishedRun) -> None:
        self.log(terminal_summary(run.records, run.swept, run.analysis))
        self.log(f"results: {run.out_dir}  (report: {run.out_dir / 'report.md'})")


class Export(Sink):
    """The finished result folder to each --export destination (checked before the suite started). A failure
    leaves the local results complete and says which command finishes the export."""

    def __init__(self, targets: list, log=print):
        self.targets, self.log = targets, log

    def finish(self, run: FinishedRun) -> None:
        for target in self.targets:
            started = time.monotonic()
            try:
                self.log(f"export {target.dest}: {target.export(run.out_dir)} ({time.monotonic() - started:.1f} s)")
            except Exception as error:  # the local results are written: say how to finish, do not lose them
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                self.log(f"export {target.dest} failed ({reason}); the results are complete in {run.out_dir}; finish with:")
                self.log(f"  segserve export {run.out_dir} {target.dest}")
