#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what is missing, builds, runs ctest.
# Extra arguments go to ctest (e.g. `tools/test.sh -L crash`).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh build
cd build
ctest -j2 --output-on-failure --timeout 900 "$@"
