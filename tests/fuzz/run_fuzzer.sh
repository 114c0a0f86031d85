#!/usr/bin/env bash
# Runs one libFuzzer target for a bounded time over a scratch copy of its corpus.
#   run_fuzzer.sh FUZZER CORPUS_DIR SECONDS
# Longer runs: the same with more seconds, e.g. 3600. A crash leaves crash-* in the scratch
# directory printed below; copy it into CORPUS_DIR so it becomes a regression input.
set -euo pipefail
fuzzer=$1 corpus=$2 seconds=$3
scratch=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-fuzz-XXXXXX")
cp -r "$corpus"/. "$scratch/"
mkdir -p "$scratch/artifacts"
echo "fuzzing $(basename "$fuzzer") for ${seconds}s; scratch corpus $scratch"
set +e
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$scratch/artifacts/" "$scratch" 2>&1 | tail -n 25
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "FUZZER FOUND A PROBLEM: inputs kept in $scratch/artifacts; add them to $corpus"
  exit "$rc"
fi
rm -rf "$scratch"
