"""What a measurement's machine is, as far as it changes which configuration wins: the CPU (vendor, family,
model, stepping), the instruction sets int8 and bf16 kernels depend on, the cores this process may use, the GPU.

An int8 convolution is fastest where the CPU multiplies int8 in one instruction (VNNI, or AMX tiles); on an
AVX2-only CPU oneDNN takes a slower path. A record that said only "AMD EPYC" could not tell whether an int8
sweep (2.7× eager) and a check that measured 0.72× ran on the same kind of CPU; this says what can.
"""

import os
import platform
import subprocess
from pathlib import Path

# /proc/cpuinfo flag → the name records carry; amx is any of AMX's tile flags
ISA_FLAGS = {"avx2": ("avx2",), "avx512f": ("avx512f",), "avx512_vnni": ("avx512_vnni",), "avx_vnni": ("avx_vnni",),
             "avx512_bf16": ("avx512_bf16",), "amx": ("amx_tile", "amx_int8", "amx_bf16")}  # fmt: skip

# what identifies a machine for comparing runs (the CPU's name, torch's version etc. are recorded beside it)
MACHINE_KEYS = ("cpu_vendor", "cpu_family", "cpu_model_number", "cpu_stepping", "cpu_isa", "cpu_cores", "gpu")


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ("vendor_id", "cpu family", "flags", …)."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_identity(cpuinfo_text: str | None = None) -> dict:
    """The CPU as records carry it; `cpuinfo_text` defaults to this machine's /proc/cpuinfo."""
    if cpuinfo_text is None:
        path = Path("/proc/cpuinfo")
        cpuinfo_text = path.read_text() if path.exists() else ""
    fields = cpuinfo_fields(cpuinfo_text)
    flags = set(fields.get("flags", "").split())

    def number(key: str) -> int | None:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else None

    return {
        "cpu_model": fields.get("model name", "?"),
        "cpu_vendor": fields.get("vendor_id", "?"),
        "cpu_family": number("cpu family"),
        "cpu_model_number": number("model"),
        "cpu_stepping": number("stepping"),
        "cpu_isa": {name: any(f in flags for f in wanted) for name, wanted in ISA_FLAGS.items()},
        "cpu_cores": len(os.sched_getaffinity(0)),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
    }


def gpu_name() -> str | None:
    """The first CUDA device's name where torch sees one (torch is imported only if it already is)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)


def machine(cpuinfo_text: str | None = None) -> dict:
    return {**cpu_identity(cpuinfo_text), "gpu": gpu_name()}


def environment(root: Path) -> dict:
    """What a run's records say measured them: the machine, Python and the serving stack's versions, the Java
    TorchServe's frontend ran on, and the commit of the checkout at `root` (a GPU bundle's project has no .git:
    its BUNDLE_COMMIT file names the commit it was built from)."""
    from importlib.metadata import version

    sha = _output(["git", "-C", str(root), "rev-parse", "--short", "HEAD"]).strip()
    dirty = _output(["git", "-C", str(root), "status", "--porcelain"]).strip()
    java = _output(["java", "-version"], stderr=True).splitlines()
    bundled = root / "BUNDLE_COMMIT"
    git_sha = (sha or "?") + ("-dirty" if dirty else "") if sha or not bundled.exists() else bundled.read_text().strip()
    return {
        **machine(),  # CPU identity and ISA, cores, GPU: what changes which configuration wins
        "python": platform.python_version(),
        "torch": version("torch"),
        "torchvision": version("torchvision"),
        "torchserve": version("torchserve"),
        "java": java[0] if java else "?",
        "git_sha": git_sha,
    }


def _output(command: list[str], stderr: bool = False) -> str:
    """What a command printed, or "" where it is not installed (a bare GPU machine has no git)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stderr if stderr else done.stdout


def label(environment: dict) -> str:
    """'AMD EPYC (AuthenticAMD family 25 model 1 stepping 1; avx2; 2 cores)': what a reader needs to tell two apart."""
    if "cpu_vendor" not in environment:
        return f"{environment.get('cpu_model', '?')} (recorded before the machine's identity was: family, model and ISA unknown)"
    isa = [name for name, present in (environment.get("cpu_isa") or {}).items() if present] or ["no AVX2"]
    text = (
        f"{environment.get('cpu_model')} ({environment.get('cpu_vendor')} family {environment.get('cpu_family')} "
        f"model {environment.get('cpu_model_number')} stepping {environment.get('cpu_stepping')}; {', '.join(isa)}; "
        f"{environment.get('cpu_cores')} cores"
    )
    return text + (f"; {environment['gpu']}" if environment.get("gpu") else "") + ")"


# what two environments are compared on when one of them was recorded before the CPU was identified
NAMED_KEYS = ("cpu_model", "cpu_cores")


def differences(a: dict, b: dict) -> list[str]:
    """The machine keys two environments disagree on ("cpu_isa", "cpu_cores", …); where either was recorded
    before the CPU was identified (no cpu_vendor), only what both have: the CPU's name and cores."""
    keys = MACHINE_KEYS if "cpu_vendor" in a and "cpu_vendor" in b else NAMED_KEYS
    return [key for key in keys if a.get(key) != b.get(key)]


def identified(environment: dict) -> bool:
    return "cpu_vendor" in environment


X86_VENDORS = ("AuthenticAMD", "GenuineIntel")


def int8_shortfall(isa: dict | None = None, vendor: str | None = None) -> str | None:
    """What int8 lacks here, or None: x86 int8 convolutions (oneDNN through inductor) multiply int8 in one
    instruction only with VNNI (avx512_vnni, avx_vnni) or AMX; without them oneDNN falls back to AVX2's
    multiply-add sequence, so int8 gains less over fp32 than where it was tuned with VNNI. Nothing is said of
    a CPU that is not x86 (its /proc/cpuinfo has none of these flags)."""
    if isa is None or vendor is None:
        here = cpu_identity()
        isa, vendor = here["cpu_isa"] if isa is None else isa, here["cpu_vendor"] if vendor is None else vendor
    if vendor not in X86_VENDORS:
        return None
    if any(isa.get(name) for name in ("avx512_vnni", "avx_vnni", "amx")):
        return None
    have = ", ".join(name for name, present in isa.items() if present) or "none of avx2, avx512f"
    return (
        f"this CPU has no VNNI and no AMX (its ISA: {have}): oneDNN's int8 convolutions run on the slower AVX2 "
        "path, so int8 gains less over fp32 than on a CPU with VNNI; measure it here rather than trust a best/ "
        "tuned on another machine"
    )


def machines_of(records) -> list[dict]:
    """The distinct machines (their environments) a set of records was measured on, in first-seen order."""
    seen: list[dict] = []
    for record in records:
        environment = record.get("environment") or {}
        if environment and not any(not differences(environment, other) for other in seen):
            seen.append(environment)
    return seen
