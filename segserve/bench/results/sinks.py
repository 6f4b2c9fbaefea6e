"""Where a run's records go: each output is one writer, fed the same records as they are measured (`add`) and
the finished run once (`finish`). A new output (an exporter) is a new class here; the runner does not change.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from segserve.bench.results.analysis import Analysis
from segserve.bench.results.plots import plot_by_param, plot_name, plot_pareto
from segserve.bench.results.render import terminal_summary
from segserve.bench.results.report import write_report
from segserve.bench.results.store import write_pipelines, write_summary
from segserve.bench.suite.columns import Record
from segserve.bench.suite.spec import Suite


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
        return self.suite.constraint_bounds


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
