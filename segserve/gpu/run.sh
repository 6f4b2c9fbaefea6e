#!/usr/bin/env bash
# The GPU check, unattended, on a machine with CUDA, Python ≥ 3.11 and torch ≥ 2.4 with its torchvision, and
# nothing else of ours: no registry, no Java, no torchserve, no pydantic (docs/gpu.md).
#
#   gpu_bundle/run.sh [--dry-run]
#
# Unpacks payload.tar.xz beside it, installs its wheels into a venv that sees the interpreter's torch, runs the
# `gpu` tests, serves the workflow and the fused pipeline on a real TorchServe (the bundle's Java runtime) and
# segments the samples through both, sends hostile and odd inputs (judged against the CPU's answers) and profiles
# the fused worker under load, measures each stage's ceiling in process, runs benchmarks/gpu.yaml (seg, jpeg, workflow,
# fused at 1, 2, 4 and 8 workers; raw FP16 [3, 256, 448], 256 connections), and writes summary.json and summary.txt
# to $OUT.
# Every step has a timeout; a step that fails is reported and the next one still runs where it can.
#
# --dry-run: the same steps where CUDA is absent (the gpu tests skip with their reason; the benchmark computes in
# fp32, as fp16 convolutions on a CPU measure nothing of interest). Without it, a machine without CUDA is a failure.
# Environment: OUT (default ./gpu_out), PYTHON (an interpreter with torch; default python3), WORK (scratch;
# default a new folder under /tmp), DEADLINE_S (default 480: steps share it, then the summary gets its minute),
# STEPS (names, comma-separated: run only these again in the WORK of an earlier run, whose other steps and their
# results stay; a second try on the device then skips unpacking and installing: STEPS=serve,bench WORK=...).
# Exit status: 0 when every step passed (and, without --dry-run, CUDA was there), else 1; 2 for a usage error.
set -uo pipefail

DRY_RUN=0
case "${1:-}" in
  "") ;;
  --dry-run) DRY_RUN=1 ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: $0 [--dry-run]" >&2; exit 2; }

HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu_out}
# the interpreter by its path: once the bundle's venv is first on PATH, "python3" would name that venv
PYTHON=$(command -v "${PYTHON:-python3}") || { echo "run.sh: no ${PYTHON:-python3} on PATH (set PYTHON)" >&2; exit 2; }
# the whole run must end inside the device tool's 10-minute call: steps get what is left, the summary its own minute
DEADLINE=$(( $(date +%s) + ${DEADLINE_S:-480} ))
SUMMARY_S=60
ALL_STEPS=" unpack facts venv gpu_tests build serve ceilings bench "
STEPS=${STEPS:-}
if [ -n "$STEPS" ]; then
  for name in ${STEPS//,/ }; do
    [[ "$ALL_STEPS" == *" $name "* ]] || { echo "run.sh: STEPS: no step '$name' (steps:$ALL_STEPS)" >&2; exit 2; }
  done
  [ -n "${WORK:-}" ] && [ -f "$WORK/steps.jsonl" ] || {
    echo "run.sh: STEPS=$STEPS runs steps again in the WORK of an earlier run: set WORK to it (it has no steps.jsonl)" >&2
    exit 2
  }
fi
# after the cheap checks: importing torch takes seconds
"$PYTHON" -c "import torch, torchvision" 2> /dev/null || {
  echo "run.sh: $PYTHON has no torch and torchvision: set PYTHON to an interpreter that has them (here: PYTHON=.venv/bin/python)" >&2
  exit 2
}
WORK=${WORK:-$(mktemp -d /tmp/segserve-gpu.XXXXXX)}
mkdir -p "$OUT" "$WORK/logs"
OUT=$(cd "$OUT" && pwd)
export OUT WORK DRY_RUN
LOG=$OUT/run.log
: > "$LOG"
[ -n "$STEPS" ] || : > "$WORK/steps.jsonl"  # a rerun appends: the summary takes each step's last line
STARTED=$(date +%s)
DEADLINE=$(( DEADLINE - SUMMARY_S ))
FAILED=0

# step NAME TIMEOUT_S COMMAND...: runs it with a timeout and no input; its output goes to $WORK/logs/NAME.log
# and into run.log; one JSON line per step in $WORK/steps.jsonl.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "$STEPS" ] && [ "$name" != summary ] && [[ ",$STEPS," != *",$name,"* ]]; then
    # not run again: its earlier outcome stands (and counts for the exit status)
    local kept
    kept=$(grep "\"step\": \"$name\"" "$WORK/steps.jsonl" | tail -n 1 | sed -n 's/.*"rc": \(-\?[0-9]*\).*/\1/p')
    echo "== $name: kept from the earlier run in $WORK (exit ${kept:-none recorded})" | tee -a "$LOG"
    [ "${kept:-1}" -eq 0 ] || FAILED=1
    return "${kept:-1}"
  fi
  local left=$(( DEADLINE - $(date +%s) ))
  [ "$name" = summary ] || { [ $left -lt $limit ] && limit=$left; }
  if [ $limit -le 0 ]; then
    echo "== $name: SKIPPED, no time left (DEADLINE_S ${DEADLINE_S:-480})" | tee -a "$LOG"
    printf '{"step": "%s", "rc": 124, "seconds": 0, "timeout_s": 0}\n' "$name" >> "$WORK/steps.jsonl"
    FAILED=1
    return 124
  fi
  local begun=$(date +%s.%N)
  echo "== $name (timeout ${limit} s)" | tee -a "$LOG"
  # a bash in between: the steps are functions of this script (exported below). On the timeout's SIGTERM (sent to
  # the whole group) the bash waits for its step to finish its cleanup (stopping a TorchServe it started) rather
  # than leave it running beside the next step; --kill-after bounds that wait.
  timeout --kill-after=15 "$limit" bash -c 'trap : TERM; "$@"' step "$@" < /dev/null > "$WORK/logs/$name.log" 2>&1
  local rc=$?
  local seconds=$(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $begun}")
  cat "$WORK/logs/$name.log" >> "$LOG"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "   $name: TIMED OUT after $limit s" | tee -a "$LOG"
  echo "   $name: exit $rc, $seconds s" | tee -a "$LOG"
  printf '{"step": "%s", "rc": %d, "seconds": %s, "timeout_s": %d}\n' "$name" "$rc" "$seconds" "$limit" >> "$WORK/steps.jsonl"
  [ $rc -eq 0 ] || FAILED=1
  return $rc
}

unpack() {
  "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' \
    "$HERE/payload.tar.xz" "$WORK" && ls "$WORK"
}

facts() {
  "$PYTHON" - <<'EOF'
import json, os, platform, shutil, subprocess, sys
import torch, torchvision
facts = {"python": platform.python_version(), "machine": platform.machine(), "libc": " ".join(platform.libc_ver()), "cpus": os.cpu_count(),
         "torch": torch.__version__, "torchvision": torchvision.__version__, "cuda": torch.cuda.is_available(),
         "dry_run": os.environ["DRY_RUN"] == "1", "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
         "bundle_commit": open(os.path.join(os.environ["WORK"], "project", "BUNDLE_COMMIT")).read().strip()}
if facts["cuda"]:
    facts.update(device=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                 cuda_runtime=torch.version.cuda)
if shutil.which("nvidia-smi"):
    facts["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip()
java = os.path.join(os.environ["WORK"], "jre", "bin", "java")  # built against glibc 2.34
answer = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20)
facts["java"] = (answer.stderr.splitlines() or ["no answer"])[0] if answer.returncode == 0 else f"FAILED: {answer.stderr.strip()[-300:]}"
json.dump(facts, open(os.path.join(os.environ["WORK"], "facts.json"), "w"), indent=2)
print(json.dumps(facts, indent=2))
if facts["java"].startswith("FAILED"):
    sys.exit(f"the bundled Java runtime does not run here: {facts['java']}")
if not facts["cuda"] and not facts["dry_run"]:
    sys.exit("CUDA is not available (torch.cuda.is_available() is False): this is not a GPU run; --dry-run runs without it")
EOF
}

make_venv() {
  "$PYTHON" -m venv --without-pip "$WORK/venv" || return 1
  local site torch_site
  site=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  # the venv sees the interpreter's torch (and what came with it: numpy, pillow, pip) through a .pth file; its own
  # site-packages, where the wheels go, comes first on sys.path
  torch_site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))') || return 1
  echo "$torch_site" > "$site/system-torch.pth"
  # and the project, from any folder (TorchServe's output capture and workers start in their own)
  echo "$WORK/project" > "$site/segserve-project.pth"
  "$WORK/venv/bin/python" -m pip install --quiet --no-index --no-deps --no-cache-dir --ignore-installed \
    --find-links "$WORK/wheels" $(cd "$WORK/wheels" && ls | sed 's/-[0-9].*//' | sort -u) || return 1
  "$WORK/venv/bin/python" -m pip list 2>/dev/null | grep -Ei '^(torch|torchvision|torchserve|torch-model-archiver|torch-workflow-archiver|pydantic|pydantic_core|PyYAML|psutil|pytest|numpy|pillow) '
  cd "$WORK/project" && "$WORK/venv/bin/python" -c 'import segserve.cli, handlers.segmentation, ts; print("imports: ok")'
}

in_project() { cd "$WORK/project" && "$@"; }

# TorchServe 0.12 reads CUDA_VISIBLE_DEVICES as indices (a GPU's UUID there stops its frontend): map UUIDs to indices
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && ! [[ "$CUDA_VISIBLE_DEVICES" =~ ^[0-9,]+$ ]] && command -v nvidia-smi > /dev/null; then
  mapped=$(timeout 20 nvidia-smi --query-gpu=index,uuid --format=csv,noheader | awk -F', ' -v want="$CUDA_VISIBLE_DEVICES" '
    { index_of[$2] = $1 } END { n = split(want, w, ","); for (i = 1; i <= n; i++) if (w[i] in index_of) s = s (s ? "," : "") index_of[w[i]]; print s }')
  if [ -n "$mapped" ]; then
    echo "CUDA_VISIBLE_DEVICES $CUDA_VISIBLE_DEVICES -> $mapped (indices for TorchServe)" | tee -a "$LOG"
    export CUDA_VISIBLE_DEVICES=$mapped
  fi
fi

export -f unpack facts make_venv in_project
export HERE PYTHON
export JAVA_HOME=$WORK/jre
export PATH=$WORK/venv/bin:$WORK/jre/bin:$PATH
export PYTHONUNBUFFERED=1

step unpack 60 unpack || { echo "cannot unpack $HERE/payload.tar.xz" | tee -a "$LOG"; exit 1; }
step facts 60 facts
step venv 120 make_venv
# the interpreter's own pytest plugins (xdist, cov, benchmark…) stay out: they may not fit the bundle's pytest
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
step gpu_tests 150 in_project python -m pytest -m gpu -v -p no:cacheprovider --junitxml="$WORK/gpu_tests.xml" \
  tests/unit/test_handlers.py tests/unit/test_batching.py tests/integration/test_handlers.py tests/integration/test_decode_fallback.py
step build 120 in_project python -m segserve.cli build
step serve 150 in_project python -m segserve.gpu.steps serve "$WORK/serve.json"
step ceilings 90 in_project python -m segserve.gpu.ceilings "$WORK/ceilings.json"
step bench 300 in_project python -m segserve.gpu.steps bench "$WORK/results"
# the summary needs only the standard library: with the venv's Python where the venv step made one (its yaml reads
# the bench's results), else with the interpreter the run was given
SUMMARY_PYTHON=$WORK/venv/bin/python
[ -x "$SUMMARY_PYTHON" ] || SUMMARY_PYTHON=$PYTHON
step summary $SUMMARY_S in_project "$SUMMARY_PYTHON" -m segserve.gpu.bundle summary "$WORK" "$OUT"
cp "$WORK/gpu_tests.xml" "$OUT/" 2>/dev/null
echo "run.sh: $(( $(date +%s) - STARTED )) s; results in $OUT; scratch in $WORK" | tee -a "$LOG"
[ -f "$OUT/summary.txt" ] && cat "$OUT/summary.txt"
exit $FAILED
