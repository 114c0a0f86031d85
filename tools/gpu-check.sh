#!/usr/bin/env bash
# The GPU check (issue #16). A GPU machine is lent for minutes at a time and
# has CUDA, CMake and ninja but none of the Debian libraries ckpt builds on,
# so the check comes in two halves:
#
#   tools/gpu-check.sh pack [BUILD_DIR]
#       Here, after tools/setup.sh: the GPU tests (the binaries of
#       `ctest -L gpu`, and the trainer they SIGKILL), ckptd and ckpt-bench,
#       stripped, with every shared library they load that a bare CUDA
#       machine lacks, into .gpu/ (ignored by git; carried to the GPU
#       machine: the device tool's carry [".gpu"]).
#   tools/gpu-check.sh run
#       On the GPU machine, from the repository root: the GPU tests, then
#       `ckpt-bench gpu --json`, then a short table of the keys against the
#       issue's goals. Logs and the JSON go to $OUT when it is set. Exit status
#       0 only when no test failed or skipped and the benchmark ran.
#
# Environment: CKPT_GPU_MIB (bytes per benchmark pass, default 4096, less
# when /dev/shm has less than 16 GiB free), CKPT_GPU_LARGE_MIB (the large
# tensor of the GPU tests, the same), CKPT_GPU_RUNS (default 5).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
pack_dir="$here/.gpu"
tests=(kernels_gpu_test client_gpu_test)

pack() {
  local build="${1:-$here/build}"
  local bins=("$build/tests/kernels_gpu_test" "$build/tests/client_gpu_test"
              "$build/tests/trainer_helper" "$build/daemon/ckptd"
              "$build/tools/ckpt-bench")
  for b in "${bins[@]}"; do
    [[ -x "$b" ]] || { echo "gpu-check: no $b (run tools/setup.sh first)" >&2; exit 1; }
  done
  rm -rf "$pack_dir"
  mkdir -p "$pack_dir/bin" "$pack_dir/lib"
  for b in "${bins[@]}"; do
    strip --strip-debug -o "$pack_dir/bin/$(basename "$b")" "$b"
  done
  # Every library the loader finds for them, but glibc's own and the driver's
  # (the GPU machine has newer ones of both).
  ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*|libcuda)\.so' |
    while read -r lib; do
      cp -L "$lib" "$pack_dir/lib/$(basename "$lib")"
    done
  strip --strip-unneeded "$pack_dir"/lib/*.so* 2>/dev/null || true
  echo "gpu-check: packed $(du -sh "$pack_dir" | cut -f1) into $pack_dir" \
       "($(ls "$pack_dir/lib" | wc -l) libraries)"
}

run() {
  [[ -d "$pack_dir/bin" ]] || { echo "gpu-check: no $pack_dir (carry it: tools/gpu-check.sh pack)" >&2; exit 1; }
  local out="${OUT:-$pack_dir/out}"
  mkdir -p "$out"
  export LD_LIBRARY_PATH="$pack_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CKPT_TEST_CKPTD="$pack_dir/bin/ckptd"
  export CKPT_TEST_TRAINER_HELPER="$pack_dir/bin/trainer_helper"
  export TEST_TMPDIR="${TEST_TMPDIR:-/tmp/ckpt-gpu-check}"
  mkdir -p "$TEST_TMPDIR"
  nvidia-smi -L || true
  # The staging tier is tmpfs: the 4 GiB test and benchmark need room there.
  df -h /dev/shm || true
  local shm_mib
  shm_mib=$(df -m --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ' || echo 0)
  if [[ "${shm_mib:-0}" -lt 20000 ]]; then
    mount -o remount,size=64G /dev/shm 2>/dev/null && df -h /dev/shm || true
    shm_mib=$(df -m --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ' || echo 0)
  fi
  local fit=$(( ${shm_mib:-0} / 4 ))
  (( fit > 4096 )) && fit=4096
  (( fit < 64 )) && fit=64
  export CKPT_GPU_LARGE_MIB="${CKPT_GPU_LARGE_MIB:-$fit}"
  : "${CKPT_GPU_MIB:=$fit}"
  echo "gpu-check: /dev/shm has ${shm_mib} MiB free; large tensors of ${CKPT_GPU_LARGE_MIB} MiB, benchmark passes of ${CKPT_GPU_MIB} MiB"
  local failed=0 line
  local -a rows=()
  for t in "${tests[@]}"; do
    local log="$out/$t.log"
    local rc=0
    "$pack_dir/bin/$t" --gtest_color=no >"$log" 2>&1 || rc=$?
    local passed skipped
    passed=$(grep -c '^\[       OK \]' "$log" || true)
    skipped=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$log" || true)
    grep -E '^\[ *(OK|FAILED|SKIPPED) *\]|Failure|seed' "$log" || true
    [[ $rc -ne 0 || $skipped -ne 0 ]] && failed=1
    rows+=("$t: $passed passed, $skipped skipped, exit $rc")
  done
  local bench_rc=0
  mkdir -p "$TEST_TMPDIR/bench"
  "$pack_dir/bin/ckpt-bench" gpu --json --size-mib "$CKPT_GPU_MIB" \
    --runs "${CKPT_GPU_RUNS:-5}" --dir "$TEST_TMPDIR/bench" \
    >"$out/bench.json" 2>"$out/bench.err" || bench_rc=$?
  cat "$out/bench.err"
  cp "$TEST_TMPDIR/bench/ckptd.log" "$out/bench-ckptd.log" 2>/dev/null || true
  echo
  echo "== GPU check =="
  for line in "${rows[@]}"; do echo "$line"; done
  if [[ -s "$out/bench.json" ]]; then
    python3 - "$out/bench.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
goals = {"d2h_vs_memcpy_large": 0.9, "d2h_vs_memcpy_small": 0.8,
         "restore_h2d_vs_memcpy": 0.8, "hash_vs_d2d": 0.5,
         "shuffle_vs_d2d": 0.5}
print(f"ckpt-bench gpu on {j['device']}, {j['size_mib']} MiB, median of {j['runs']}")
print(f"{'key':30} {'value':>8} {'goal':>8}")
for k, goal in goals.items():
    v = j.get(k)
    if v is None:
        print(f"{k:30} {'-':>8} {'>= ' + str(goal):>8} NOT MEASURED")
        continue
    print(f"{k:30} {v:8.3f} {'>= ' + str(goal):>8} {'ok' if v >= goal else 'SHORT'}")
v = j.get("host_stall_ms")
if v is None:
    print(f"{'host_stall_ms':30} {'-':>8} {'< 5':>8} NOT MEASURED")
else:
    print(f"{'host_stall_ms':30} {v:8.2f} {'< 5':>8} {'ok' if v < 5 else 'SHORT'}")
for k in ("d2h_gib_s", "d2h_memcpy_pinned_gib_s", "h2d_gib_s", "hash_gib_s",
          "hash_chunks_gib_s", "shuffle_gib_s", "d2d_gib_s",
          "small_gathered_gib_s", "small_per_tensor_gib_s",
          "small_memcpy_pinned_gib_s", "save_staged_gib_s",
          "restore_memory_gib_s"):
    if k in j:
        print(f"{k:30} {j[k]:8.1f} GiB/s")
if "first_save_stall_ms" in j:
    print(f"{'first_save_stall_ms':30} {j['first_save_stall_ms']:8.1f} ms (maps and pins the slot)")
if j.get("failed"):
    print("failed:", ", ".join(j["failed"]))
EOF
  fi
  if [[ $bench_rc -ne 0 ]]; then
    echo "ckpt-bench gpu failed (exit $bench_rc)"
    failed=1
  fi
  return $failed
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) run ;;
  *) sed -n '2,/^set /{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
