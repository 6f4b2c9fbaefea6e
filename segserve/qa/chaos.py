"""`make chaos`: the served pipeline under load while its processes are killed, rescaled and sent hostile input.

One server, started and restarted with `segserve serve` as a user would, on free loopback ports:
  1. closed-loop load on four targets (workflow, fused, seg, jpeg); kill -9 one worker of every model in
     turn (each workflow node, the fused model, seg, jpeg), rescale a workflow node 1 → 2 → 1, and send
     the hostile inputs (the fuzz corpus and crafted ones) to every endpoint;
  2. kill -9 the frontend (Java) under load, then `segserve serve` again;
  3. load and hostile inputs again: the server must be usable.
It prints, per target, requests sent / answered 2xx / 4xx / 5xx / unanswered, and each worker's restart time.

A short form (what `make test` runs, tests/system/test_smoke.py): `--targets seg_jpeg --pause-s 0.5 --rps 4
--load-s 2` serves the workflow alone (its two nodes killed in turn, one rescaled, the frontend killed and served
again) under a light open-loop load, and judges the same goal.

Goal (exit 1 when missed): no 5xx for a request that was not in flight on a killed process, none unanswered,
every hostile input refused (400; /wfpredict answers 200 with the node's {"error"} body: counted as refused),
no worker replaced while the hostile inputs were sent (each model's worker pids, READY, the same before and
after: only those rounds, since the kills replace workers on purpose), and the server usable afterwards. "In
flight on a killed process" is judged per target: sent before the kill and answered after it (a superset of the
batch the process held). Requests refused while the frontend was down are counted apart: nothing listened, so
they were not lost.
"""

import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torchvision.io import encode_png

from handlers import classmap
from segserve import ROOT
from segserve.bench.run.load import CONNECTION_ERROR, TIMEOUT, LoadResult, LoadSpec, run_load
from segserve.model.synthetic import make_sample
from segserve.serving.served_pipeline import served_targets
from segserve.serving.server import TorchServe
from segserve.serving.ts_config import free_port_base


def target_paths(names: str | None = None) -> dict[str, tuple[str, str]]:
    """What `segserve serve --targets NAMES` registers (default: the catalog's default family): target → (path,
    input kind). (Named apart from launch.served_targets: when both were served_targets and the import went, this
    one called itself.)"""
    return {t.name: (t.endpoint, "classmap" if t.takes == "class_map" else "image") for t in served_targets(names)}


MARGIN_S = 0.05  # clock slack between the load threads and the killer when judging "in flight at a kill"
MAX_HOSTILE_MISSES = 3  # a round of hostile inputs stops after this many not refused: the goal is missed already


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    refused: int = 0  # 4xx
    failed_in_flight: int = 0  # 5xx or no answer, in flight on a killed process
    failed: int = 0  # 5xx not explained by a kill
    unanswered: int = 0  # timeout or connection error, not explained by a kill
    down: int = 0  # connection refused while the frontend was down
    failures: dict[int, int] = field(default_factory=dict)  # status (0: connection error, -1: timeout) → count

    def line(self, name: str) -> str:
        return (
            f"{name:16s} {self.sent:6d} {self.ok:6d} {self.refused:6d} {self.failed_in_flight:10d} {self.failed:6d} "
            f"{self.unanswered:10d} {self.down:6d}"
        )


@dataclass
class Chaos:
    server: TorchServe
    serve: list[str]  # `segserve serve` with --run-dir/--model-store/--config/--port-base (and --targets)
    rate_rps: float | None = None  # per target; None: a closed loop of 2 connections each
    kills: list[tuple[str, float]] = field(default_factory=list)  # (target, monotonic time) of each kill
    frontend_down: tuple[float, float] | None = None
    restarts_s: dict[str, float] = field(default_factory=dict)
    targets: dict[str, tuple[str, str]] = field(default_factory=target_paths)
    tallies: dict[str, Tally] = field(default_factory=dict)
    hostile_misses: list[str] = field(default_factory=list)
    hostile_refused: int = 0
    hostile_served: list[str] = field(default_factory=list)  # corpus inputs that are valid after all
    workers_replaced: list[str] = field(default_factory=list)  # a model whose workers changed while hostile inputs were sent
    results: list[tuple[str, LoadResult, float]] = field(default_factory=list)  # (target, its load, monotonic start)

    # Load ----------------------------------------------------------------------------------------------
    def load(self, duration_s: float, stop: threading.Event) -> list[threading.Thread]:
        """One closed-loop stream per target in a thread; each tallies its requests when it ends."""
        image_bodies = [p.read_bytes() for p in sorted((ROOT / "samples").glob("*.jpg"))]
        labels = make_sample(7, 256, 448)[1].to(torch.uint8)
        bodies = {"image": image_bodies, "classmap": [classmap.pack(labels, 2, 360, 640)]}
        token = self.server.token("inference")
        threads = []
        for target, (path, kind) in self.targets.items():
            spec = LoadSpec(
                self.server.url("inference"), path, bodies[kind], token, concurrency=2, request_rate_rps=self.rate_rps, timeout_s=60
            )
            thread = threading.Thread(target=self._stream, args=(target, spec, duration_s, stop), daemon=True)
            thread.start()
            threads.append(thread)
        return threads

    def _stream(self, target: str, spec: LoadSpec, duration_s: float, stop: threading.Event) -> None:
        started = time.monotonic()
        result = run_load(spec, duration_s, stop_early=lambda _: stop.is_set(), check_every_s=0.2)
        self.results.append((target, result, started))

    def tally(self) -> None:
        """Each request's fate, judged once every kill and the frontend's downtime are known."""
        for target, result, started in self.results:
            tally = self.tallies.setdefault(target, Tally())
            for intended, end, status in zip(result.intended_s, result.end_s, result.status, strict=True):
                sent_at, ended_at = started + intended, started + end
                tally.sent += 1
                if 200 <= status < 300:
                    tally.ok += 1
                elif 400 <= status < 500:
                    tally.refused += 1
                elif status == CONNECTION_ERROR and self._frontend_was_down(sent_at):
                    tally.down += 1
                elif self._in_flight_on_a_kill(target, sent_at, ended_at):
                    tally.failed_in_flight += 1
                elif status in (CONNECTION_ERROR, TIMEOUT):
                    tally.unanswered += 1
                else:
                    tally.failed += 1
                if not 200 <= status < 500:
                    tally.failures[status] = tally.failures.get(status, 0) + 1

    def _in_flight_on_a_kill(self, target: str, sent_at: float, ended_at: float) -> bool:
        kills = [at for victim, at in self.kills if victim in (target, "frontend")]
        return any(sent_at - MARGIN_S <= at <= ended_at + MARGIN_S for at in kills)

    def _frontend_was_down(self, at: float) -> bool:
        """Sent after the frontend was killed and before `segserve serve` had it back."""
        return self.frontend_down is not None and self.frontend_down[0] <= at <= self.frontend_down[1]

    # Faults --------------------------------------------------------------------------------------------
    def kill_worker(self, target: str, model: str) -> None:
        worker = next(w for w in self.server.describe(model)["workers"] if int(w.get("pid") or -1) > 0)
        old_pid = int(worker["pid"])
        os.kill(old_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        self.kills.append((target, killed_at))
        deadline = killed_at + 120
        while time.monotonic() < deadline:
            workers = self.server.describe(model)["workers"]
            if workers and all(w.get("status") == "READY" and int(w.get("pid") or -1) not in (-1, old_pid) for w in workers):
                self.restarts_s[model] = time.monotonic() - killed_at
                print(f"  killed {model} worker {old_pid}: a new worker was READY after {self.restarts_s[model]:.1f} s")
                return
            time.sleep(0.1)
        raise RuntimeError(f"{model}: no worker READY 120 s after killing pid {old_pid}")

    def kill_frontend(self) -> None:
        java = [pid for pid in self.server.process_ids() if b"java" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]]
        if not java:
            raise RuntimeError(f"no Java frontend among the server's processes {self.server.process_ids()}")
        os.kill(java[0], signal.SIGKILL)
        self.kills.append(("frontend", time.monotonic()))
        print(f"  killed the frontend (java, pid {java[0]})")

    def restart(self) -> float:
        started = time.monotonic()
        subprocess.run(self.serve, check=True, stdout=subprocess.DEVNULL)
        return time.monotonic() - started

    # Hostile inputs ------------------------------------------------------------------------------------
    def send_hostile(self) -> int:
        """Every hostile input to every endpoint that takes its kind. A crafted one must be refused; a corpus
        input (it once crashed or broke a worker) may also be served if it is a valid image after all. No worker
        may be replaced meanwhile (a worker killed by an input is back by the next request: only its pid tells).
        After MAX_HOSTILE_MISSES misses the round stops: each worker an input kills costs a restart, or a time-out."""
        from segserve.serving.http import Connection

        before, misses_before = settled_worker_pids(self.server), len(self.hostile_misses)
        connection = Connection(self.server.url("inference"), self.server.token("inference"), timeout_s=60)
        targets = self.targets.items()
        sends = [(n, body, must, t, path) for n, kind, body, must in hostile_inputs() for t, (path, k) in targets if k == kind]
        sent = 0
        try:
            for name, body, must_refuse, target, path in sends:
                if len(self.hostile_misses) - misses_before >= MAX_HOSTILE_MISSES:
                    self.hostile_misses.append(f"the round stopped there: {len(sends) - sent} of its requests not sent")
                    break
                sent += 1
                try:
                    response = connection.request("POST", path, body)
                except OSError as error:
                    self.hostile_misses.append(f"{name} → {target}: no answer ({error})")
                    connection.close()
                    continue
                if refused(response.status, response.body):
                    self.hostile_refused += 1
                elif not must_refuse and response.status == 200:
                    self.hostile_served.append(f"{name} → {target}")
                else:
                    self.hostile_misses.append(f"{name} → {target}: HTTP {response.status} {response.text()[:120]!r}")
        finally:
            connection.close()
        self.workers_replaced += replaced_workers(before, worker_pids(self.server))
        return sent


def worker_pids(server) -> dict[str, list[tuple]]:
    """Each registered model's workers as (pid, status): a worker that died shows its old pid UNLOADING, then a new
    pid (TorchServe's describe API)."""
    return {model: sorted((w.get("pid"), w.get("status")) for w in server.describe(model).get("workers", [])) for model in server.models()}


def settled_worker_pids(server, timeout_s: float = 60) -> dict[str, list[tuple]]:
    """worker_pids once every worker is READY: a kill or a rescale just before may still be settling."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = worker_pids(server)
        if all(status == "READY" for workers in pids.values() for _, status in workers) or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def replaced_workers(before: dict, after: dict) -> list[str]:
    """'model: workers before → after' for each model whose workers are not the same READY processes."""
    changed = []
    for model, workers in before.items():
        now = after.get(model, [])
        if now != workers or any(status != "READY" for _, status in now):
            changed.append(f"{model}: workers (pid, status) {workers} → {now}")
    return changed


def refused(status: int, body: bytes) -> bool:
    """A 400, or TorchServe 0.12's workflow 200 that carries a node's {"error": ...} body."""
    if status == 400:
        return True
    try:
        return status == 200 and "error" in json.loads(body)
    except (ValueError, UnicodeDecodeError, TypeError):
        return False


def hostile_inputs() -> list[tuple[str, str, bytes, bool]]:
    """(name, kind, body, must be refused): the fuzz corpus of regression inputs, and crafted ones that once
    killed a worker or were served a meaningless answer."""
    from segserve.qa.fuzz import CORPUS, read_corpus
    from segserve.qa.fuzz_inputs import header_text_errors

    kinds = {"seg": "image", "fused": "image", "jpeg": "classmap", "areas": "classmap"}
    items = [(item.description, kind, item.body, False) for target, kind in kinds.items() for item in read_corpus(CORPUS, target)]
    wide = encode_png(torch.zeros(3, 4, 70_000, dtype=torch.uint8)).numpy().tobytes()
    labels = torch.ones(4, 4, dtype=torch.uint8)
    nan = torch.full((3, 256, 448), float("nan"), dtype=torch.float16).numpy().tobytes()
    size = struct.pack(">II", 40_000, 40_000)
    ihdr = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + size + b"\x08\x02\x00\x00\x00" + b"\x00" * 4
    # upstream error bodies whose message could break a status line (issue 64): to every endpoint of either kind
    crafted = [(item.description, kind, item.body) for item in header_text_errors() for kind in ("image", "classmap")]
    crafted += [
        ("png 70000x4", "image", wide),
        ("png header claiming 40000x40000", "image", ihdr),
        ("raw fp16 of NaN", "image", nan),
        ("truncated jpeg", "image", (ROOT / "samples" / "shapes_1.jpg").read_bytes()[:2000]),
        ("class map claiming 65501x1", "classmap", classmap.pack(labels, 2, 65_501, 1)),
        ("class map truncated", "classmap", classmap.pack(labels, 2, 8, 8)[:-3]),
    ]
    return items + [(name, kind, body, True) for name, kind, body in crafted]


def run(
    run_dir: Path, model_store: Path, load_s: float, targets: str | None = None, pause_s: float = 2, rate_rps: float | None = None
) -> bool:
    port_base = free_port_base()
    segserve = [sys.executable, "-m", "segserve.cli"]
    common = ["--run-dir", str(run_dir), "--model-store", str(model_store), "--config", str(ROOT / "config.properties")]
    server = TorchServe(run_dir=run_dir, model_store=model_store, config_template=ROOT / "config.properties", port_base=port_base)
    serve = [*segserve, "serve", *common, "--port-base", str(port_base), *(["--targets", targets] if targets else [])]
    chaos = Chaos(server, serve, rate_rps=rate_rps, targets=target_paths(targets))
    print(f"$ segserve serve --run-dir {run_dir} --port-base {port_base}")
    first_start_s = chaos.restart()
    print(f"  up in {first_start_s:.1f} s")
    try:
        stop = threading.Event()
        print(f"phase 1: load on {', '.join(chaos.targets)}; a worker of each model killed in turn; rescale; hostile inputs")
        threads = chaos.load(600, stop)  # until the frontend is killed
        time.sleep(1.5 * pause_s)
        nodes = server.workflow_nodes()
        for target in chaos.targets:  # every worker model of a workflow, else the target's own model
            for model in [n for n in nodes if n.startswith(f"{target}__")] or [target]:
                chaos.kill_worker(target, model)
                time.sleep(pause_s)
        rescaled = nodes[-1] if nodes else next(iter(chaos.targets))  # a workflow node, else a model target
        for workers in (2, 1):
            server.scale(rescaled, workers)
            print(f"  scaled {rescaled} to {workers} worker(s)")
            time.sleep(pause_s)
        print(f"  {chaos.send_hostile()} hostile requests sent")
        print("phase 2: the frontend killed under load, then `segserve serve` again")
        time.sleep(pause_s)
        chaos.kill_frontend()
        down_from = chaos.kills[-1][1]
        time.sleep(0.5 * pause_s)
        stop.set()
        for thread in threads:
            thread.join()
        restart_s = chaos.restart()
        chaos.frontend_down = (down_from, time.monotonic())
        chaos.restarts_s["frontend (segserve serve)"] = restart_s
        print(f"  serving again {restart_s:.1f} s after `segserve serve`")
        print("phase 3: load and hostile inputs on the restarted server")
        threads = chaos.load(load_s, threading.Event())
        print(f"  {chaos.send_hostile()} hostile requests sent")
        for thread in threads:
            thread.join()
    finally:
        subprocess.run([*segserve, "serve", *common, "--stop"], check=False)
        server.stop()
    return report(chaos)


def report(chaos: Chaos) -> bool:
    chaos.tally()
    print(f"\n{'target':16s} {'sent':>6s} {'2xx':>6s} {'4xx':>6s} {'5xx/lost*':>10s} {'5xx':>6s} {'unanswered':>10s} {'down':>6s}")
    for target, tally in chaos.tallies.items():
        print(tally.line(target))
    names = {CONNECTION_ERROR: "connection error", TIMEOUT: "timeout"}
    for target, tally in chaos.tallies.items():
        if tally.failures:
            print(f"{target}: failures by status: " + ", ".join(f"{names.get(k, k)} × {n}" for k, n in sorted(tally.failures.items())))
    print("* in flight on a killed process (sent before the kill, answered after it); down: refused while no frontend listened")
    print("\nrestart times: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in chaos.restarts_s.items()))
    failed = sum(t.failed for t in chaos.tallies.values())
    unanswered = sum(t.unanswered for t in chaos.tallies.values())
    usable = all(t.ok > 0 for t in chaos.tallies.values())
    print(f"hostile requests: {chaos.hostile_refused} refused, {len(chaos.hostile_served)} served as valid images (corpus only)")
    for served in chaos.hostile_served:
        print(f"  served: {served}")
    for miss in chaos.hostile_misses:
        print(f"hostile input not refused: {miss}")
    for replaced in chaos.workers_replaced:
        print(f"worker replaced during the hostile inputs: {replaced}")
    goal = failed == 0 and unanswered == 0 and not chaos.hostile_misses and not chaos.workers_replaced and usable
    print(
        f"\ngoal {'met' if goal else 'MISSED'}: {failed} 5xx outside a kill, {unanswered} unanswered, "
        f"{len(chaos.hostile_misses)} hostile inputs not refused, {len(chaos.workers_replaced)} model(s) with a worker "
        f"replaced by them, server {'usable' if usable else 'NOT usable'} afterwards"
    )
    return goal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m segserve.qa.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--model-store", default="model_store", help="built archives (segserve build)")
    parser.add_argument("--run-dir", help="the server's folder, kept for its logs (default: a new temporary folder)")
    parser.add_argument("--load-s", type=float, default=15, help="seconds of load on the restarted server (default: 15)")
    parser.add_argument("--targets", help="comma-separated catalog targets to serve and load (default: the default DAG's family)")
    parser.add_argument("--pause-s", type=float, default=2, help="seconds of load between two faults (default: 2)")
    parser.add_argument("--rps", type=float, help="open-loop requests per second per target (default: a closed loop of 2 connections each)")
    args = parser.parse_args(argv)
    if args.pause_s <= 0 or args.load_s <= 0 or (args.rps is not None and args.rps <= 0):
        parser.error("--pause-s, --load-s and --rps must be positive")
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="segserve-chaos-")).resolve()
    print(f"server folder (logs): {run_dir}")
    return 0 if run(run_dir, Path(args.model_store).resolve(), args.load_s, args.targets, args.pause_s, args.rps) else 1


if __name__ == "__main__":
    sys.exit(main())
