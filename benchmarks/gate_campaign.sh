#!/bin/bash
# How the regression gate was judged (README, "Numbers you can trust"): N A/A comparisons (the same code on both
# sides) and N A/B comparisons with B slowed down by SLOWDOWN (10%: SEGSERVE_TEST_SLOWDOWN=0.1), alternating,
# each `segserve bench ab benchmarks/gate.yaml` with ROUNDS rounds. Prints one line per comparison and the counts.
#   benchmarks/gate_campaign.sh [N=20] [SLOWDOWN=0.1] [ROUNDS=2]
set -u
N=${1:-20}; SLOWDOWN=${2:-0.1}; ROUNDS=${3:-2}
OUT=${OUT:-results/gate-campaign}
mkdir -p "$OUT"
false_alarms=0; detected=0
for i in $(seq 1 "$N"); do
  for kind in aa ab; do
    env=(); [ "$kind" = ab ] && env=(--b-env "SEGSERVE_TEST_SLOWDOWN=$SLOWDOWN")
    started=$(date +%s)
    .venv/bin/segserve bench ab benchmarks/gate.yaml --a . --b . --rounds "$ROUNDS" "${env[@]}" --results "$OUT/$kind-$i" > "$OUT/$kind-$i.log" 2>&1
    code=$?
    seconds=$(( $(date +%s) - started ))
    if [ "$kind" = aa ] && [ $code = 1 ]; then false_alarms=$((false_alarms + 1)); fi
    if [ "$kind" = ab ] && [ $code = 1 ]; then detected=$((detected + 1)); fi
    echo "$kind $i exit $code ${seconds}s: $(grep -o 'overall, B vs A.*(min' "$OUT/$kind-$i.log")"
  done
done
echo "A/A false alarms: $false_alarms of $N; A/B ($SLOWDOWN slower) detected: $detected of $N"
