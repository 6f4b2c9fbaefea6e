"""best/: the best point of a suite, ready to serve again. Every target of ours writes best/config.properties and
best/machine.json; then its kind adds what registers it so: a catalog workflow or fused target its DAG's spec with
the point's values (best/<dag>.yaml); a user's archive its register.sh, a .war's spec, the k8s and KServe
manifests (results/manifests.py) and, for a .war, the workflow fused into one .mar (best/fused/). An http or
command target writes nothing: it is not ours to deploy."""

import json
import shlex
import shutil
from functools import partial
from pathlib import Path
from urllib.parse import quote, urlencode

import yaml

from segserve.archives import registration
from segserve.archives.catalog import Catalog
from segserve.archives.registration import REGISTRATIONS, workflow_entry, workflow_top
from segserve.bench.results import sizing
from segserve.bench.results.manifests import node_value, served_foreign, served_fused, write_manifests
from segserve.bench.results.sinks import FinishedRun, Sink
from segserve.errors import RuntimeFailure, UsageError
from segserve.machine.identity import label
from segserve.serving.ts_config import render_config
from segserve.shown_text import for_terminal

# best/register.sh: TorchServe 0.12 writes key_file.json (its keys, mode 0600) in the directory it was started from,
# and wants `Authorization: Bearer <management key>` on every management call (best/config.properties keeps token
# authorization on). The key goes to curl on its stdin (--config -), never in an argument that ps shows.
SCRIPT = """#!/bin/sh
{header}# TS_MANAGEMENT: the management API (default http://127.0.0.1:8081)
# TS_KEY_FILE: TorchServe's key_file.json (default: the one in the directory TorchServe was started from)
set -eu
management="${{TS_MANAGEMENT:-http://127.0.0.1:8081}}"
key_file="${{TS_KEY_FILE:-key_file.json}}"
if [ ! -r "$key_file" ]; then
    echo "register.sh: no TorchServe key file at $key_file: set TS_KEY_FILE to the key_file.json of its start directory" >&2
    exit 2
fi
key=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["management"]["key"])' "$key_file")

call() {{  # METHOD PATH: one management call, the key on curl's stdin
    printf 'header = "Authorization: Bearer %s"\\n' "$key" | curl -fsS --config - -X "$1" "$management$2"
}}

"""


# best/config.properties says which engine the point was measured on and how to serve it so (docs/ray.md)
ENGINE_LINES = {
    "torchserve": "# Engine: TorchServe (measured on it): `segserve serve --config best/config.properties --no-targets`, or "
    "`torchserve --start --ts-config best/config.properties`.",
    "ray": "# Engine: Ray Serve with TorchServe's APIs (measured on it, HAProxy in front): `segserve serve --engine ray --config "
    "best/config.properties --no-targets`; the same management API and key file, so register.sh works unchanged.",
}


def path_name_problem(what: str, name: str) -> str | None:
    """Why a name that becomes a file name (in best/, a model store, a bucket) cannot be one, or None."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("-") or any(ord(c) < 32 for c in name):
        return f"{what} {name!r}: must be a file name (no '/', no '..', not absolute, no control character, no leading '-'); rename it"
    return None


def registration_of(chosen: dict, prefix: str = "") -> dict:
    """The registration values of a record ({name: value}), DAG-wide or of one node (prefix `<node>_`)."""
    return {name: chosen[prefix + name] for name in REGISTRATIONS if chosen.get(prefix + name) is not None}


class Best(Sink):
    """best/ from the best workflow or fused point (else any target's of ours), by its kind (the module's doc)."""

    def __init__(self, catalog: Catalog, log=print, fuse=None):
        # fuse(war, model_store, out, log, worker_env=) → the fused .mar (segserve/fuse/, given by the command: a layer above)
        self.catalog, self.log, self.fuse = catalog, log, fuse

    def finish(self, run: FinishedRun) -> None:
        winners = run.analysis.winners
        # a workflow's best first, then a fused twin's, then a model's; an http or command target's never (not ours)
        ours = sorted((name for name in winners if name in self.catalog.targets), key=lambda name: self.catalog.targets[name].best_rank)
        chosen = next((winners[name] for name in ours if winners[name]), None)
        if chosen is None:
            return
        # a workflow (or fused twin) ranked above the chosen point that has none: what it lost, said in best/
        passed_over = {name: run.analysis.no_winner.get(name) for name in ours[: ours.index(chosen["target"])]}
        best_dir = run.out_dir / "best"
        best_dir.mkdir(exist_ok=True)
        on = self.server_config(best_dir, chosen, run.environment, passed_over)
        target = self.catalog.targets[chosen["target"]]
        foreign = self.catalog.foreign.get(target.name)
        if foreign is not None:
            fuse = self.fuse and partial(self.fuse, worker_env=run.suite.archive_worker_env)  # its import check: as its workers
            bound = sizing.p99_bound_ms(run.suite.constraint_bounds)  # sizes a Ray point (best/rayservice.yaml)
            ArchiveFiles(target, foreign, chosen, on, self.log, bound).write(best_dir, run.suite.core_plan, fuse)
        elif target.dag is not None:
            dag_spec(best_dir, chosen, self.catalog.dags[target.dag], on)

    def server_config(self, best_dir: Path, chosen: dict, environment: dict, passed_over: dict | None = None) -> str:
        """best/config.properties (the point's netty threads, what to start TorchServe with, and why a target ranked
        above the point's has no best point: `passed_over`, {target: why}) and best/machine.json; returns the line
        that says which machine the point is best on (every file of best/ carries it)."""
        overrides = {"number_of_netty_threads": str(chosen["netty_threads"])} if chosen.get("netty_threads") else {}
        render_config(self.catalog.config_template, best_dir / "config.properties", overrides)
        # best for the machine it was measured on: int8 that wins with VNNI loses without it
        machine = chosen.get("environment") or environment
        on = f"# Best on: {label(machine)}; on another machine, measure again (best/machine.json)."
        (best_dir / "machine.json").write_text(json.dumps({"label": label(machine), **machine}, indent=2) + "\n")
        note = f"# Best point of this suite: {chosen['run_id']} ({chosen['target']}, {chosen['throughput_rps']:.1f} req/s).\n{on}"
        note += "\n" + ENGINE_LINES[chosen.get("engine") or "torchserve"]
        if chosen.get("omp_num_threads"):
            note += f"\n# Start TorchServe with OMP_NUM_THREADS={chosen['omp_num_threads']} in its environment (workers inherit it)."
        for name, why in (passed_over or {}).items():
            said = f"Not {name}, which has no best point: {' '.join(str(why or 'not measured').split())}"
            note += f"\n# {said}"
            self.log(f"best/: {said}")
        text = (best_dir / "config.properties").read_text()
        (best_dir / "config.properties").write_text(note + "\n" + text)
        return on


def dag_spec(best_dir: Path, chosen: dict, dag, on: str) -> None:
    """A catalog workflow's or fused twin's point: its DAG's spec with the point's values (best/<dag>.yaml), DAG-wide
    then each node's own (a node's param is <node>_<param>), as the point's .war had them."""
    spec = yaml.safe_load(dag.spec_path.read_text())
    spec["models"].update(workflow_entry(registration_of(chosen)))
    for node in dag.nodes:
        workers = chosen.get(f"{node}_workers") or chosen["workers"]
        spec["models"][node].update(workflow_entry(registration_of(chosen, f"{node}_"), workers))
    header = f"# From {chosen['run_id']} ({chosen['target']}).\n{on}\n"
    (best_dir / f"{dag.name}.yaml").write_text(header + yaml.safe_dump(spec, sort_keys=False))


class ArchiveFiles:
    """A user's .mar or .war at its best point: register.sh, a .war's spec, the manifests, a .war fused."""

    def __init__(self, target, foreign, chosen: dict, on: str, log=print, p99_bound_ms: float | None = None):
        self.target, self.foreign, self.chosen, self.on, self.log = target, foreign, chosen, on, log
        self.p99_bound_ms = p99_bound_ms
        self.header = f"# From {chosen['run_id']} ({chosen['target']}).\n{on}\n"

    def write(self, best_dir: Path, core_plan, fuse) -> None:
        unsafe = [problem for problem in (path_name_problem(what, name) for what, name in self.path_names()) if problem]
        if unsafe:  # nothing of it is written: its name would become a path (or a command) elsewhere
            for problem in unsafe:
                self.log(f"best/register.sh and manifests not written: {problem}")
            return
        self.register_script(best_dir)
        served = served_foreign(self.target, self.foreign, self.chosen)
        for refused in write_manifests(best_dir, self.chosen, served, self.on, core_plan, p99_bound_ms=self.p99_bound_ms):
            self.log(refused)  # the rest of best/ stays
        if self.foreign.is_workflow and fuse is not None:
            self.fused(best_dir, core_plan, fuse)

    def path_names(self) -> list[tuple[str, str]]:
        """The names that become file names here, in a model store or a bucket: (what it is, the name)."""
        archive = self.foreign.path.name if not self.foreign.is_workflow else f"{self.target.name}.war"
        return [("target name", self.target.name), ("archive name", archive)]

    def register_script(self, best_dir: Path) -> None:
        """The management API calls that register it so (best/register.sh), and for a .war its spec with each node's
        values written in (best/<name>.yaml, to archive again). Every name in a URL is URL-encoded and every
        argument shell-quoted; the management key is read from TorchServe's key file and sent on curl's stdin."""
        name, chosen = self.target.name, self.chosen
        if not self.foreign.is_workflow:
            archive = quote(self.foreign.path.name, safe="")
            query = registration.register_query(archive, quote(name, safe=""), chosen["workers"], registration_of(chosen))
            calls = [f"call POST {shlex.quote(f'/models?{query}')}"]
            scale = f"/models/{quote(name, safe='')}?{registration.scale_query(chosen['workers'])}"
            calls.append(f"call PUT {shlex.quote(scale)}")
        else:
            values = workflow_top(chosen)  # the top-level timeout and retries, as the point's copy had them: function nodes'
            for node in self.foreign.nodes:
                registered = {param: node_value(chosen, node, param) for param in REGISTRATIONS}
                values[node] = workflow_entry(registered, node_value(chosen, node, "workers"))
            (best_dir / f"{name}.yaml").write_text(self.header + yaml.safe_dump(self.foreign.spec_with(values), sort_keys=False))
            register = f"/workflows?{urlencode({'url': f'{name}.war', 'workflow_name': name})}"
            calls = [
                f"# archive best/{shlex.quote(name)}.yaml with your handler into {shlex.quote(name)}.war (torch-workflow-archiver"
                " --spec-file), then:",
                f"call POST {shlex.quote(register)}",
            ]
        header = "".join(line if line.startswith("#") else f"# {line}" for line in self.header.splitlines(keepends=True))
        (best_dir / "register.sh").write_text(SCRIPT.format(header=header) + "\n".join(calls) + "\n")

    def fused(self, best_dir: Path, core_plan, fuse) -> None:
        """The .war's best point as one .mar that KServe can serve (`segserve fuse`), with its k8s and KServe
        manifests, in best/fused/; or best/fused.txt saying why its workflow cannot be fused."""
        fused_dir, war = best_dir / "fused", self.target.name
        name = f"fused_{war}"  # segserve fuse's own name for it (docs/fuse.md)
        try:
            fused_dir.mkdir(exist_ok=True)
            mar = fuse(self.foreign.path, self.foreign.model_store, fused_dir / f"{name}.mar", log=lambda _: None)
        except (UsageError, RuntimeFailure) as why:  # a node it cannot fuse, or the archiver failing on it
            shutil.rmtree(fused_dir, ignore_errors=True)
            (best_dir / "fused.txt").write_text(f"{war}.war cannot be fused into one .mar, so KServe cannot serve it: {why}\n")
            self.log(f"best/: no fused .mar of {war}.war: {for_terminal(why)}")  # it may quote the user's handler
            return
        shutil.copy(best_dir / "config.properties", fused_dir / "config.properties")
        notes = (
            f"{mar.name}: `segserve fuse {war}.war` (every node in one worker); the workflow was measured, not it:",
            f"measure it with an archive target {{name: {name}, archive: best/fused/{mar.name}}} before relying on its rate",
        )
        served = served_fused(name, mar, self.chosen, self.target.nodes[0].name)
        for refused in write_manifests(fused_dir, self.chosen, served, self.on, core_plan, notes=notes, measured=False):
            self.log(refused)
