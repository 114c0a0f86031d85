#!/usr/bin/env bash
# The main job on the embedded default (one node, no etcd): installs what is missing, builds, and
# runs the demo: a local ckptd and a 4-rank job that trains a deterministic toy model and saves
# every step; a rank is SIGKILLed mid-save and the job resumes from the latest committed step,
# then ckptd is SIGKILLed mid-persist and restarted; the final state must be bit-identical to an
# uninterrupted run. Extra arguments go to ckpt-demo (e.g. --steps 200 --ranks 8).
set -euo pipefail
cd "$(dirname "$0")/.."
# Only what the demo runs: the tests, fuzzers and the PyPI PyTorch venv are the test command's.
CKPT_BUILD_TARGETS="ckpt-demo ckptd ckpt-demo-trainer ckpt" CKPT_TORCH_VENV=0 tools/setup.sh build
exec build/tools/ckpt-demo "$@"
