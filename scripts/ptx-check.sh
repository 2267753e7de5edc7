#!/usr/bin/env bash
# Fingerprints the GPU code of every layer and GPU object the build compiles
# (bench/, test/GPU/, runtime/layers/: each `nsa-opt --nsa-to-ptx` command
# ninja knows), so that a refactoring can show it leaves the PTX byte-
# identical:
#   scripts/ptx-check.sh write FILE     # at the commit before the change
#   scripts/ptx-check.sh compare FILE   # after it: lists what differs
# Each object is compiled again with format=isa (PTX text instead of a
# cubin: no ptxas needed) and the whole output, kernels and host code, is
# hashed (less the compile time recorded in it). `compare` exits 1 and
# names the objects whose code changed.
#   NSA_BUILD_DIR  the build (default <repo>/build); NSA_JOBS parallel jobs
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${NSA_BUILD_DIR:-$root/build}
mode=${1:-}; file=${2:-}
[[ ($mode == write || $mode == compare) && -n $file ]] ||
  { echo "usage: scripts/ptx-check.sh write|compare FILE" >&2; exit 2; }

# "<source> <options>" of each nsa-to-ptx command, one a line.
commands=$(ninja -C "$build" -t commands | python3 -c '
import shlex, sys
seen = set()
for line in sys.stdin:
    if "--nsa-to-ptx=" not in line:
        continue
    words = shlex.split(line.split(" && ")[1])  # cmake -E env ... nsa-opt ...
    at = next(i for i, w in enumerate(words) if w.endswith("/nsa-opt"))
    options = next(w for w in words if w.startswith("--nsa-to-ptx="))
    entry = words[at + 1] + " " + options[len("--nsa-to-ptx="):]
    if entry not in seen:
        seen.add(entry)
        print(entry)
')
[[ -n $commands ]] || { echo "ptx-check: no nsa-to-ptx commands in $build" >&2; exit 1; }
# The sources (generated layer modules among them) and nsa-opt, up to date.
sources=$(cut -d' ' -f1 <<<"$commands" | sort -u)
ninja -C "$build" nsa-opt $(sed "s|^$build/||" <<<"$sources" | grep -v "^/") >/dev/null

fingerprint() {
  local source=$1; shift
  local options=${*//format=bin/format=isa}
  [[ $options == *format=isa* ]] || options="$options format=isa"
  local hash
  # (less the compile time gpu-module-to-binary records in each object)
  hash=$("$build/bin/nsa-opt" "$source" "--nsa-to-ptx=$options" |
    sed 's/LLVMIRToISATimeInMs = [0-9]* : i64, //' | sha256sum | cut -c1-16)
  local name=${source#$build/}
  name=${name#$(dirname "$build")/}
  echo "$name [$options] $hash"
}
export -f fingerprint
export build
now=$(mktemp)
trap 'rm -f "$now"' EXIT
xargs -P "${NSA_JOBS:-$(nproc)}" -L 1 bash -c 'fingerprint "$@"' _ <<<"$commands" |
  sort > "$now"
if [[ $mode == write ]]; then
  cp "$now" "$file"
  echo "ptx-check: $(wc -l < "$file") objects fingerprinted into $file"
  exit 0
fi
if diff -u "$file" "$now"; then
  echo "ptx-check: $(wc -l < "$now") objects, code byte-identical"
else
  echo "ptx-check: the objects above changed" >&2
  exit 1
fi
