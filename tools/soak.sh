#!/usr/bin/env bash
# The chaos soak (not part of the test suite): runs ckpt-chaos on one-node and
# three-node clusters, with every fault kind the harness has, until at least
# --faults faults were injected in all, and writes a report: faults by kind,
# steps committed, committed steps restored and compared, recovery p50/p99,
# violations. Each run gets a fresh seed (printed); the working directory of a
# run with a violation is kept, the others are deleted.
#
#   tools/soak.sh                       # 1000 faults, report in build/soak/
#   tools/soak.sh --faults 200 --out /tmp/soak
#
# Runs alternate: a one-node run (2 ranks), a three-node run on etcd (3
# ranks), and every third one-node run with a memory budget that forces
# evictions. Exit 1 if any run had a violation.
set -euo pipefail
cd "$(dirname "$0")/.."

faults=1000
out=build/soak
build=build
one_node=40    # faults per one-node run
three_node=30  # faults per three-node run
while [[ $# -gt 0 ]]; do
  case "$1" in
    --faults) faults="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    *) echo "soak.sh: unknown argument '$1' (--faults N, --out DIR, --build DIR)" >&2; exit 2 ;;
  esac
done
chaos="$build/tools/ckpt-chaos"
if [[ ! -x "$chaos" ]]; then
  echo "soak.sh: $chaos is missing: build first (tools/setup.sh $build)" >&2
  exit 2
fi
mkdir -p "$out/runs"
: > "$out/runs.jsonl"
started=$(date +%s)
total=0
run=0
failed=0
while (( total < faults )); do
  run=$((run + 1))
  seed=$(( (RANDOM << 15 | RANDOM) ))
  dir="$out/runs/run-$run"
  rm -rf "$dir"
  case $((run % 3)) in
    1) args=(--ranks 2 --faults "$one_node") ; shape="1 node" ;;
    2) args=(--nodes 3 --ranks 3 --faults "$three_node") ; shape="3 nodes" ;;
    0) args=(--ranks 2 --faults "$one_node" --memory-budget 700K) ; shape="1 node, small budget" ;;
  esac
  printf 'soak: run %d (%s), seed %d ... ' "$run" "$shape" "$seed"
  rc=0
  "$chaos" "${args[@]}" --elements 16384 --seed "$seed" --dir "$dir" --json \
    > "$dir.json" 2> "$dir.stderr" || rc=$?
  if [[ ! -s "$dir.json" ]]; then
    echo "no report (exit $rc); see $dir.stderr"
    failed=$((failed + 1))
    if (( failed >= 5 )); then echo "soak: 5 runs failed; stopping" >&2; break; fi
    continue
  fi
  python3 - "$dir.json" "$shape" "$run" >> "$out/runs.jsonl" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
r["shape"] = sys.argv[2]
r["run"] = int(sys.argv[3])
print(json.dumps(r))
EOF
  n=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["faults_injected"], r["violations"])' "$dir.json")
  injected=${n% *}
  violations=${n#* }
  total=$((total + injected))
  if (( rc != 0 || violations > 0 )); then
    failed=$((failed + 1))
    echo "$injected faults, $violations VIOLATIONS (kept: $dir)"
  else
    echo "$injected faults, no violation ($total in all)"
    rm -rf "$dir"
  fi
done
elapsed=$(( $(date +%s) - started ))

python3 - "$out/runs.jsonl" "$elapsed" > "$out/report.md" <<'EOF'
import collections, json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
elapsed = int(sys.argv[2])
kinds = collections.Counter()
shapes = collections.Counter()
recover = []
for r in runs:
    kinds.update(r["faults"])
    shapes[r["shape"]] += r["faults_injected"]
    recover += r.get("recover_s", [])
recover.sort()
def pct(p):
    return recover[min(len(recover) - 1, int(p * len(recover)))] if recover else 0.0
violations = [(r["run"], r["seed"], v) for r in runs for v in r["violation_details"]]
print("# ckpt-chaos soak")
print()
print(f"{len(runs)} runs, {sum(kinds.values())} faults in {elapsed // 60} min {elapsed % 60} s;"
      f" by cluster: " + ", ".join(f"{s}: {n}" for s, n in sorted(shapes.items())))
print()
print("| fault | injected |")
print("|---|---|")
for k, n in sorted(kinds.items()):
    print(f"| {k} | {n} |")
print()
print(f"- recoveries: {sum(r['recoveries'] for r in runs)}; time to recover p50 {pct(0.5):.2f} s,"
      f" p99 {pct(0.99):.2f} s, max {recover[-1] if recover else 0:.2f} s")
print(f"- kill points reached (kills during GC and replication): "
      f"{sum(r.get('kill_points_reached', 0) for r in runs)}")
print(f"- steps committed (the jobs' final steps, summed): {sum(r['final_step'] for r in runs)}")
print(f"- committed steps restored and compared byte for byte: "
      f"{sum(r['committed_steps_checked'] for r in runs)}")
print(f"- steps recomputed per job restart: max {max((r['steps_lost_max'] for r in runs), default=0)}")
print(f"- violations: {len(violations)}")
for run, seed, v in violations:
    print(f"  - run {run} (seed {seed}): {v}")
EOF
cat "$out/report.md"
echo "soak: report in $out/report.md, per-run reports in $out/runs.jsonl"
(( failed == 0 ))
