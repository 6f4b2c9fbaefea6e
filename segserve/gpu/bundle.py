"""The GPU bundle: the GPU check for a bare CUDA machine that has Python and torch but no registry, no Java and
none of our other packages (docs/gpu.md).

    python -m segserve.gpu.bundle build [--out gpu_bundle]    what `make gpu-bundle` runs
    python -m segserve.gpu.bundle summary WORK OUT            what gpu_bundle/run.sh ends with

The bundle is a folder of two files: run.sh (segserve/gpu/run.sh) and payload.tar.xz, which holds
  project/   the tracked files of this checkout and the trained weights,
  wheels/    what the checks import that such a machine lacks, at the versions tested here (binary ones for
             CPython 3.11–3.13 on x86-64 Linux),
  jre/       a Java runtime for TorchServe's frontend, cut with jlink from this machine's JDK.
It must stay under BUNDLE_LIMIT_BYTES: the device tool carries at most 64 MiB with the checkout.
"""

import argparse
import base64
import hashlib
import importlib.metadata
import io
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from segserve import ROOT
from segserve.errors import UsageError

BUNDLE_LIMIT_BYTES = 60 * 1024 * 1024
PURE_WHEELS = (
    "torchserve",
    "torch-model-archiver",
    "torch-workflow-archiver",
    "enum-compat",
    "pydantic",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "pytest",
    "pluggy",
    "iniconfig",
    "pygments",  # pytest's own needs: the interpreter's versions may be older
    "packaging",
)
BINARY_WHEELS = ("pydantic-core", "pyyaml", "psutil", "py-spy")  # py-spy: the serve step profiles the fused worker
PYTHON_VERSIONS = ("3.11", "3.12", "3.13")
# pip matches manylinux tags exactly: the ones these packages publish for x86-64
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
# What TorchServe 0.12's frontend (netty, log4j, gson, grpc) loads; checked by the dry run, which serves with it.
JRE_MODULES = (
    "java.base,java.logging,java.management,java.naming,java.xml,java.sql,java.desktop,jdk.unsupported,"
    "java.scripting,jdk.crypto.ec,java.net.http,jdk.management"
)


def pinned(name: str) -> str:
    """name==version of what this environment runs: the bundle ships what was tested here."""
    return f"{name}=={importlib.metadata.version(name)}"


def download_wheels(wheels: Path, log=print) -> None:
    """The pinned wheels, fetched by four pip processes at once (one after another they took 22 s, most of it
    waiting on the index), each into a folder of its own: psutil's abi3 wheel is the same file for every CPython
    version, and two pips writing it into one folder at once read each other's half-written file as a bad hash
    (make test, 2026-12-04). The folders are then merged; a file two of them fetched is kept once."""
    log(f"wheels: {', '.join(PURE_WHEELS)}")
    requests = [[*map(pinned, PURE_WHEELS)]]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    for version in PYTHON_VERSIONS:
        log(f"wheels for CPython {version}: {', '.join(BINARY_WHEELS)}")
        requests.append(["--python-version", version, "--implementation", "cp", *platforms, *map(pinned, BINARY_WHEELS)])
    folders = [wheels / f"pip-{index}" for index in range(len(requests))]
    commands = [
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(folder), *request]
        for folder, request in zip(folders, requests, strict=True)
    ]
    downloads = [subprocess.Popen(command) for command in commands]
    failed = [command for command, download in zip(commands, downloads, strict=True) if download.wait() != 0]
    if failed:
        raise RuntimeError(f"pip download failed: {' '.join(failed[0])}")
    for folder in folders:
        for wheel in folder.iterdir():
            if not (wheels / wheel.name).exists():
                wheel.rename(wheels / wheel.name)
        shutil.rmtree(folder)
    uncompress_torchserve(next(wheels.glob("torchserve-*.whl")))


def foreign_native(name: str) -> bool:
    """A native library in the frontend jar for another platform than x86-64 Linux (netty's and jansi's for macOS,
    Windows, aarch64, 32-bit): 10.7 MB of 106 that the bundle's machine never loads (netty picks its platform's
    file by name)."""
    if not name.startswith("META-INF/native/") or name.endswith("/"):
        return False
    return not any(mark in name for mark in ("linux_x86_64", "epoll_x86_64", "/linux64/"))


def uncompress_torchserve(wheel: Path) -> None:
    """Store the wheel and its frontend jar without compression, so that xz compresses the classes as one stream
    (42 MB deflated file by file; about half that as one xz stream). Same files, same contents, less the other
    platforms' native libraries; the jar's RECORD line gets its new hash and size."""
    jar_name = "ts/frontend/model-server.jar"
    with zipfile.ZipFile(wheel) as source:
        members = [(info, source.read(info)) for info in source.infolist()]
    contents = {info.filename: data for info, data in members}
    jar = io.BytesIO()
    with zipfile.ZipFile(jar, "w", zipfile.ZIP_STORED) as stored, zipfile.ZipFile(io.BytesIO(contents[jar_name])) as deflated:
        for info in deflated.infolist():
            if not foreign_native(info.filename):
                stored.writestr(_stored(info), deflated.read(info))
    contents[jar_name] = jar.getvalue()
    record_name = next(name for name in contents if name.endswith(".dist-info/RECORD"))
    digest = base64.urlsafe_b64encode(hashlib.sha256(contents[jar_name]).digest()).rstrip(b"=").decode()
    lines = [
        f"{jar_name},sha256={digest},{len(contents[jar_name])}" if line.startswith(jar_name + ",") else line
        for line in contents[record_name].decode().splitlines()
    ]
    contents[record_name] = ("\n".join(lines) + "\n").encode()
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as out:
        for info, _ in members:
            out.writestr(_stored(info), contents[info.filename])


def _stored(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """The same entry (name, time, permissions), stored."""
    stored = zipfile.ZipInfo(info.filename, info.date_time)
    stored.external_attr = info.external_attr
    stored.compress_type = zipfile.ZIP_STORED
    return stored


def cut_jre(destination: Path, log=print) -> None:
    jlink = shutil.which("jlink")
    if jlink is None:
        raise UsageError("gpu-bundle: jlink not found (it comes with a JDK, e.g. Debian's openjdk-17-jdk-headless)")
    log(f"jre: jlink {JRE_MODULES}")
    args = ["--add-modules", JRE_MODULES, "--strip-debug", "--no-header-files", "--no-man-pages", "--output", str(destination)]
    subprocess.run([jlink, *args], check=True)


def copy_project(destination: Path, log=print) -> None:
    listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    tracked = subprocess.run(listing, cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    weights = [ROOT / "weights" / name for name in ("seg.pt", "seg.json")]
    if not weights[0].exists():
        raise UsageError("gpu-bundle: weights/seg.pt is missing: run `make build` (it trains the model) first")
    # the weights are tracked (shipped); a user's own, ignored by git, go too
    files = list(dict.fromkeys([ROOT / name for name in tracked if name and (ROOT / name).is_file()] + [w for w in weights if w.exists()]))
    log(f"project: {len(files)} files")
    for path in files:
        target = destination / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)

    # the records' git_sha there (the bundle has no .git): the commit, and -dirty with uncommitted changes
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()

    sha, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    (destination / "BUNDLE_COMMIT").write_text(sha + ("-dirty" if dirty else "") + "\n")


def build_bundle(out: Path, log=print) -> int:
    out = out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        payload = Path(scratch)
        copy_project(payload / "project", log)
        # jlink (4 s of CPU) while the pips wait on the index: 4 s less than one after the other
        with ThreadPoolExecutor(1) as jlink:
            jre = jlink.submit(cut_jre, payload / "jre", log)
            download_wheels(payload / "wheels", log)
            jre.result()
        log("payload.tar.xz: compressing")
        tar = subprocess.Popen(["tar", "-C", str(payload), "-cf", "-", "project", "wheels", "jre"], stdout=subprocess.PIPE)
        with open(out / "payload.tar.xz", "wb") as sink:
            # -2: 54.8 MiB in 24 s on 2 cores (47 CPU-s); -4: 51.6 MiB for 83 CPU-s; -1: 56.2 MiB for 32 CPU-s
            # (measured 2026-12-03 on the 199 MB tar, the jar's foreign natives left out). make test builds it.
            subprocess.run(["xz", "-T0", "-2"], stdin=tar.stdout, stdout=sink, check=True)
        if tar.wait() != 0:
            raise RuntimeError("tar failed")
    shutil.copy2(ROOT / "segserve" / "gpu" / "run.sh", out / "run.sh")
    size = sum(p.stat().st_size for p in out.iterdir())
    log(f"{out}: {size / 2**20:.1f} MiB (limit {BUNDLE_LIMIT_BYTES / 2**20:.0f} MiB)")
    if size > BUNDLE_LIMIT_BYTES:
        raise UsageError(f"gpu-bundle: {size / 2**20:.1f} MiB is over the {BUNDLE_LIMIT_BYTES / 2**20:.0f} MiB limit")
    return size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m segserve.gpu.bundle", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write the bundle folder")
    build.add_argument("--out", type=Path, default=ROOT / "gpu_bundle")
    summary = commands.add_parser("summary", help="summary.json and summary.txt of a run of run.sh")
    summary.add_argument("work", type=Path)
    summary.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        build_bundle(args.out)
        return 0
    from segserve.gpu.summary import write_summary

    return write_summary(args.work, args.out)


if __name__ == "__main__":
    sys.exit(main())
