#!/usr/bin/env bash
# The main job on the embedded default (one node, no etcd): installs what is missing, builds, and
# runs the demo. Until ckptd exists the demo saves a 4-rank sharded model state through the full
# snapshot pipeline, restores it, checks it bit for bit and verifies every chunk.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build
out="${CKPT_DEMO_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ckpt-demo-XXXXXX")}"
build/tools/ckpt-demo --dir "$out" "$@"
build/tools/ckpt verify "$out"/*.shard
