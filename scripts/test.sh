#!/usr/bin/env bash
# README command 2: set up, build, and run every test (lit + unit tests)
# through ctest, whose summary line ends the output.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
build=${NSA_BUILD_DIR:-$root/build}
cd "$build"
exec ctest --output-on-failure -j "$(nproc)" "$@"
