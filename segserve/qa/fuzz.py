"""Fuzz every handler's input path in a child process: `python -m segserve.qa.fuzz --seconds 60`.

Targets: seg (JPEG/PNG/raw decode), jpeg and areas (class-map input), fused (the seg → jpeg pipeline
in one worker). The handlers run in a child (segserve/qa/fuzz_worker.py) with the real limits of
model_config/*.yaml. Each input (segserve/qa/fuzz_inputs.py) is the middle row of a batch
[good, fuzzed, good] and must get 200 or 400, with a well-formed answer, while both batch-mates get
200; handle() must not raise (TorchServe would answer 500 for the whole batch), and no status phrase or
header may be one that kills a TorchServe worker (fuzz_worker.unsafe_answer). A crash (the child
dies: a signal) or a hang (no answer within --timeout-s) restarts the child. With --save-crashes
each finding's input goes to <corpus>/<target>/<sha>.bin with a .txt saying how it was made; corpus
files are tried first, as seeds. Exit status 1 if anything was found.
"""

import argparse
import contextlib
import gzip
import hashlib
import json
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from segserve.qa.fuzz_inputs import Input, InputSource, good_input
from segserve.qa.fuzz_worker import ROOT, handler_settings, make_model_dir, send

TARGETS = ("seg", "jpeg", "areas", "fused")
CORPUS = ROOT / "tests" / "fuzz_corpus"
TIMEOUT_S = 30.0  # per input; the slowest valid input (25 M pixels through the fused pipeline) takes ~3 s
STARTUP_TIMEOUT_S = 180.0
MAX_SAVED_BYTES = 100_000  # a bigger input is saved gzipped if that fits, else only reported
SAVED_PER_CAUSE = 2  # per run: a cause's later inputs are reported, not saved
PROGRESS_EVERY_S = 10.0
FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


@dataclass
class Finding:
    target: str
    kind: str  # crash | hang | bad answer
    symptom: str  # the same for every input with this cause: findings are grouped by it
    input: Input
    detail: str = ""
    saved: str = ""

    @property
    def cause(self) -> tuple[str, str, str]:
        return self.target, self.kind, self.symptom


class ChildLost(Exception):
    """args: (kind, symptom) of a crash or a hang."""


class Child:
    """The worker process; ask() raises ChildLost on a crash (a signal) or a hang (it is then killed by pid)."""

    def __init__(self, model_dir: Path, targets: list[str]):
        self.stderr = tempfile.TemporaryFile()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "SEGSERVE_THREADS": "1"}
        command = [sys.executable, "-m", "segserve.qa.fuzz_worker", str(model_dir), ",".join(targets)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, cwd=ROOT, env=env)
        self.ready = False

    def wait_ready(self) -> "Child":
        if not self.ready:
            try:
                self.receive(STARTUP_TIMEOUT_S)
            except ChildLost as lost:
                raise RuntimeError(f"the fuzz worker did not start ({lost}):\n{self.stderr_tail(3000)}") from None
            self.ready = True
        return self

    def ask(self, target: str, bodies: list[bytes], timeout_s: float) -> dict:
        try:
            send(self.process.stdin, (target, bodies))
        except BrokenPipeError:
            self.receive(1.0)  # dead: reports how it died
        return self.receive(timeout_s)

    def receive(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        try:
            size = struct.unpack("<Q", self.read(8, deadline))[0]
            return pickle.loads(self.read(size, deadline))
        except TimeoutError:
            self.process.send_signal(signal.SIGUSR1)  # faulthandler writes where it hangs
            time.sleep(1.0)
            self.close()
            raise ChildLost("hang", f"no answer in {timeout_s:.0f} s{self.where()}") from None

    def read(self, size: int, deadline: float) -> bytes:
        fd, data = self.process.stdout.fileno(), bytearray()
        while len(data) < size:
            if not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
                raise TimeoutError
            chunk = os.read(fd, min(size - len(data), 1 << 20))
            if not chunk:
                code = self.process.wait(timeout=10)
                how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit status {code}"
                raise ChildLost("crash", how + self.where())
            data += chunk
        return bytes(data)

    def stderr_tail(self, size: int) -> str:
        self.stderr.seek(max(self.stderr.seek(0, os.SEEK_END) - size, 0))
        return self.stderr.read().decode(errors="replace")

    def where(self) -> str:
        """Where faulthandler's stack stands: ' in encode_jpeg (image.py:361) from predict (jpeg.py:112)'."""
        tail = self.stderr_tail(20_000)
        stack = FRAME.findall(tail[max(tail.rfind("Current"), 0) :])
        # torch's dispatcher and comprehensions say little: the frame under them names the op
        stack = [(Path(path), f"{fn} ({Path(path).name}:{line})") for path, line, fn in stack if "_ops.py" not in path and fn[0] != "<"]
        if not stack:
            return ""
        ours = [frame for path, frame in stack if path.parent.name == "handlers" and frame != stack[0][1]]
        return f" in {stack[0][1]}" + (f" from {ours[0]}" if ours else "")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # by pid: only our own child
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(BrokenPipeError):  # a request half-written to a child that died
                stream.close()


# Judging answers ---------------------------------------------------------------------
def well_formed(target: str, output: bytes) -> bool:
    from handlers import classmap

    if target == "seg":
        try:
            labels = classmap.unpack(output)
        except ValueError:
            return False
        return int(labels.labels.max()) < labels.num_classes
    if target in ("jpeg", "fused"):
        return output[:2] == b"\xff\xd8" and output[-2:] == b"\xff\xd9"
    if target == "areas":
        try:
            return isinstance(json.loads(output), dict)
        except ValueError:
            return False
    return True


def non_finite_raw(target: str, body: bytes, raw_nbytes: int) -> bool:
    """A raw FP16 tensor body holding NaN or Inf: no segmentation can come of it, so it must be a 400."""
    import numpy as np

    if target not in ("seg", "fused") or len(body) != raw_nbytes or body.startswith((b"\x89PNG", b"\xff\xd8")):
        return False
    return not np.isfinite(np.frombuffer(body, dtype=np.float16)).all()


def judge(target: str, body: bytes, reply: dict, raw_nbytes: int) -> tuple[str, str] | None:
    """(symptom, detail) of a wrong answer to [good, body, good]; None when it is right."""
    if reply["error"]:
        return f"handle() raised {reply['error'].split(':')[0]} (TorchServe: 500 for the whole batch)", reply["error"][:300]
    if reply.get("unsafe"):
        return "a status phrase or header that kills a TorchServe worker", "; ".join(reply["unsafe"])[:300]
    statuses, outputs = reply["statuses"], reply["outputs"]
    if statuses[1] not in (200, 400):
        return f"status {statuses[1]} for the fuzzed row", bytes(outputs[1][:300]).decode(errors="replace")
    if statuses[0] != 200 or statuses[2] != 200:
        return f"batch-mates answered {statuses[0]} and {statuses[2]}", ""
    for row, (status, output) in enumerate(zip(statuses, outputs, strict=True)):
        if status == 200 and not well_formed(target, output):
            return f"200 with a malformed {target} answer", f"row {row}: {len(output)} bytes starting {bytes(output[:16])!r}"
    if statuses[1] == 200 and non_finite_raw(target, body, raw_nbytes):
        return "200 for a raw tensor holding NaN/Inf (expected 400)", ""
    return None


class Harness:
    """One child for the given targets (restarted after a crash or hang); check() answers a Finding or None."""

    def __init__(self, targets: list[str], timeout_s: float = TIMEOUT_S):
        self.targets, self.timeout_s = list(targets), timeout_s
        self.folder = tempfile.TemporaryDirectory(prefix="segserve-fuzz-")
        self.model_dir = make_model_dir(Path(self.folder.name)) if set(targets) - {"selftest"} else Path(self.folder.name)
        self.good = {target: good_input(target) for target in targets}
        seg = handler_settings("seg.yaml")
        if seg["raw_dtype"] != "float16":  # raw bodies are made (fuzz_inputs.raw_body) and judged as FP16
            raise ValueError(f"model_config/seg.yaml: raw_dtype {seg['raw_dtype']!r}: the fuzzer makes float16 raw bodies only")
        self.raw_nbytes = 3 * seg["input_height"] * seg["input_width"] * 2
        self.child, self.spare = Child(self.model_dir, self.targets).wait_ready(), None

    def check(self, target: str, item: Input) -> Finding | None:
        try:
            reply = self.child.ask(target, [self.good[target], item.body, self.good[target]], self.timeout_s)
        except ChildLost as lost:
            self.child.close()
            self.child = (self.spare or Child(self.model_dir, self.targets)).wait_ready()  # counted as this input's time
            self.spare = Child(self.model_dir, self.targets)  # warming up meanwhile: crashes come in runs
            return Finding(target, *lost.args, item)
        problem = judge(target, item.body, reply, self.raw_nbytes)
        if problem is None:
            return None
        symptom, detail = problem
        return Finding(target, "bad answer", symptom, item, detail)

    def close(self) -> None:
        for child in (self.child, self.spare):
            if child is not None:
                child.close()
        self.folder.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# Corpus --------------------------------------------------------------------------------------------
def read_corpus(corpus: Path, target: str) -> list[Input]:
    """Saved inputs of a target (<sha>.bin or, for big ones, <sha>.bin.gz), described by their .txt."""
    inputs = []
    for path in sorted((corpus / target).glob("*.bin*")):
        body = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        note = path.with_name(path.name.split(".")[0] + ".txt")
        lines = note.read_text().splitlines() if note.exists() else []
        how = next((line.removeprefix("input: ") for line in lines if line.startswith("input: ")), "")
        inputs.append(Input(f"corpus {target}/{path.name}: {how}", body))
    return inputs


def save_input(corpus: Path, target: str, body: bytes, note: str) -> str:
    """<corpus>/<target>/<sha12>.bin (.bin.gz when only that fits) and its note as .txt; the path, or '' if too big."""
    path = corpus / target / (hashlib.sha256(body).hexdigest()[:12] + ".bin")
    if len(body) > MAX_SAVED_BYTES:
        body, path = gzip.compress(body, mtime=0), path.with_suffix(".bin.gz")
        if len(body) > MAX_SAVED_BYTES:
            return ""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    path.with_name(path.name.split(".")[0] + ".txt").write_text(note)
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


# The run -------------------------------------------------------------------------------------------
@dataclass
class Run:
    """What a fuzz run did, per target: inputs tried, seconds spent, its slowest input; and what it found."""

    seed: int
    tried: dict[str, int]
    spent_s: dict[str, float]
    slowest: dict[str, tuple[float, str]]
    findings: list[Finding]

    def summary(self) -> str:
        lines = [f"fuzz summary (seed {self.seed}, {sum(self.spent_s.values()):.0f} s)"]
        lines.append(f"{'target':8} {'inputs':>7} {'inputs/s':>9} {'findings':>9}  slowest input")
        for target, count in self.tried.items():
            found = sum(f.target == target for f in self.findings)
            seconds, description = self.slowest[target]
            rate = count / max(self.spent_s[target], 1e-9)
            lines.append(f"{target:8} {count:7d} {rate:9.1f} {found:9d}  {seconds:.1f} s: {description[:100]}")
        causes: dict[tuple, list[Finding]] = defaultdict(list)
        for finding in self.findings:
            causes[finding.cause].append(finding)
        lines.append(f"{len(self.findings)} finding(s) of {len(causes)} cause(s)" + (":" if causes else ""))
        for (target, kind, symptom), group in causes.items():
            lines.append(f"  {target} {kind}: {symptom} (x{len(group)})")
            for finding in group[:3]:
                where = finding.saved or "not saved (--save-crashes)"
                lines.append(f"    {finding.input.description[:200]} -> {where}" + (f"\n      {finding.detail}" if finding.detail else ""))
            if len(group) > 3:
                lines.append(f"    … and {len(group) - 3} more")
        return "\n".join(lines)


def fuzz(targets, seconds: float, seed: int = 0, corpus: Path | None = CORPUS, save_crashes=False, timeout_s=TIMEOUT_S, log=print) -> Run:
    """Fuzz the targets for `seconds`, shared evenly among them (the next input goes to the one with the least time)."""
    run = Run(seed, dict.fromkeys(targets, 0), dict.fromkeys(targets, 0.0), dict.fromkeys(targets, (0.0, "")), [])
    saved_per_cause: dict[tuple, int] = defaultdict(int)
    with Harness(targets, timeout_s) as harness:
        sources = {t: InputSource(t, seed, harness.raw_nbytes, read_corpus(corpus, t) if corpus else []) for t in targets}
        started = last_progress = time.monotonic()
        while time.monotonic() - started < seconds:
            target = min(targets, key=run.spent_s.get)
            item = next(sources[target])
            before = time.monotonic()
            finding = harness.check(target, item)
            took_s = time.monotonic() - before
            run.spent_s[target] += took_s
            run.tried[target] += 1
            run.slowest[target] = max(run.slowest[target], (took_s, item.description))
            if finding:
                cause = finding.cause
                if save_crashes and corpus and saved_per_cause[cause] < SAVED_PER_CAUSE:
                    note = f"{finding.kind}: {finding.symptom}\n" + (f"detail: {finding.detail}\n" if finding.detail else "")
                    note += f"input: {item.description}\nfound by: segserve.qa.fuzz --seed {seed}, input {run.tried[target]} of {target}\n"
                    finding.saved = save_input(corpus, target, item.body, note) or f"not saved: {len(item.body)} bytes"
                    saved_per_cause[cause] += not finding.saved.startswith("not saved")
                if not any(cause == f.cause for f in run.findings):  # later ones: in the summary
                    log(f"[{time.monotonic() - started:5.0f} s] {target} {finding.kind}: {finding.symptom} <- {item.description[:160]}")
                run.findings.append(finding)
            if time.monotonic() - last_progress >= PROGRESS_EVERY_S:
                last_progress = time.monotonic()
                counts = ", ".join(f"{t} {n}" for t, n in run.tried.items())
                log(f"[{last_progress - started:5.0f} s] inputs: {counts}; findings: {len(run.findings)}")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m segserve.qa.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz, shared evenly among the targets")
    parser.add_argument("--seed", type=int, default=0, help="inputs are a function of the seed")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="saved inputs, tried first; findings go here with --save-crashes")
    parser.add_argument("--save-crashes", action="store_true", help="save each finding's input to the corpus")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S, help="a hang: no answer to one input within this")
    args = parser.parse_args(argv)
    targets = args.targets.split(",")
    unknown = sorted(set(targets) - {*TARGETS, "selftest"})
    if unknown:
        parser.error(f"unknown target(s) {unknown}: choose from {', '.join(TARGETS)}")
    run = fuzz(targets, args.seconds, args.seed, args.corpus, args.save_crashes, args.timeout_s)
    print(run.summary())
    return 1 if run.findings else 0


if __name__ == "__main__":
    sys.exit(main())
