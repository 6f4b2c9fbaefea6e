#!/bin/bash
# How the regression gate was judged (README, "Numbers you can trust"): N iterations, each one A/A comparison (the
# same code on both sides) and one A/B comparison per SLOWDOWN (B's handler spins that fraction of its time:
# SEGSERVE_TEST_SLOWDOWN), every one `segserve bench ab benchmarks/gate.yaml --rounds ROUNDS`. Prints one line per
# comparison and, at the end, the counts: false alarms of A/A, detections of each A/B.
#   OUT=results/gate-campaign benchmarks/gate_campaign.sh [N=20] [ROUNDS=2] [SLOWDOWNS="0.1 0.25"]
set -u
N=${1:-20}; ROUNDS=${2:-2}; SLOWDOWNS=${3:-0.1 0.25}
OUT=${OUT:-results/gate-campaign}
mkdir -p "$OUT"
declare -A flagged
kinds="aa"; for s in $SLOWDOWNS; do kinds="$kinds ab$s"; done
for kind in $kinds; do flagged[$kind]=0; done
for i in $(seq 1 "$N"); do
  for kind in $kinds; do
    env=(); [ "$kind" != aa ] && env=(--b-env "SEGSERVE_TEST_SLOWDOWN=${kind#ab}")
    started=$(date +%s)
    .venv/bin/segserve bench ab benchmarks/gate.yaml --a . --b . --rounds "$ROUNDS" "${env[@]}" --results "$OUT/$kind-$i" > "$OUT/$kind-$i.log" 2>&1
    code=$?
    [ $code = 1 ] && flagged[$kind]=$((flagged[$kind] + 1))
    echo "$kind $i exit $code $(( $(date +%s) - started ))s: $(grep -o 'overall, B vs A.*(min' "$OUT/$kind-$i.log")"
  done
done
for kind in $kinds; do
  if [ "$kind" = aa ]; then echo "A/A false alarms: ${flagged[$kind]} of $N"
  else echo "A/B with B ${kind#ab} slower (SEGSERVE_TEST_SLOWDOWN): detected ${flagged[$kind]} of $N"; fi
done
