#!/usr/bin/env bash
# A libFuzzer run over nsa's front end (nsa-fuzz) or its GPU lowering to
# PTX text (nsa-fuzz-gpu, --target=gpu; test/Fuzz/nsa-fuzz.cpp): builds
# the target with clang-22 (coverage + AddressSanitizer; scripts/setup.sh
# installs clang-22 and libclang-rt-22-dev) in its own build directory, makes
# the seed corpus from every .mlir file under test/ (split at `// -----`),
# and runs it. A crash, a hang (an input over 25 s in this instrumented
# build, 1-2.5 s in a release one) or an OOM (over 2 GB)
# fails the run; the input is kept under <build>/<target>-artifacts/ and
# printed.
#   scripts/fuzz.sh [--target=front|gpu] [--seconds=S | --runs=N]
#                   [--jobs=J] [--no-asan]
#   NSA_FUZZ_BUILD_DIR   build directory (default: <repo>/build-fuzz, or
#                        <repo>/build-fuzz-noasan with --no-asan)
#   NSA_FUZZ_ARGS        more libFuzzer flags (e.g. -report_slow_units=5,
#                        which keeps inputs over 5 s as slow-unit-* too)
# --no-asan: coverage only, about 3x the inputs a second, for long counted
# runs (crashes, hangs and OOMs are still caught; silent memory errors are
# not), with the same 25 s hang limit (its coverage and comparison tracing
# alone slowed one max_hops input 25x: 32.3 s against 1.28 s in release).
# The ctest `fuzz` runs it for 60 s (CI); docs/Testing.md gives the long
# runs' counts.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=60
runs=
jobs=1
asan=1
target=nsa-fuzz
for arg in "$@"; do
  case $arg in
    --target=front) target=nsa-fuzz ;;
    --target=gpu) target=nsa-fuzz-gpu ;;
    --seconds=*) seconds=${arg#*=} ;;
    --runs=*) runs=${arg#*=} ;;
    --jobs=*) jobs=${arg#*=} ;;
    --no-asan) asan=0 ;;
    *) echo "fuzz.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

build=${NSA_FUZZ_BUILD_DIR:-$root/build-fuzz}
sanitizers=address
hang=25
if ((asan == 0)); then
  build=${NSA_FUZZ_BUILD_DIR:-$root/build-fuzz-noasan}
  sanitizers=
fi

command -v clang++-22 >/dev/null ||
  { echo "fuzz.sh: clang++-22 not found (scripts/setup.sh installs clang-22 and libclang-rt-22-dev)" >&2; exit 1; }

prefix=${LLVM_PREFIX:-$(llvm-config-22 --prefix)}
if [[ ! -f $build/build.ninja ]]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                           -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DNSA_ENABLE_FUZZER=ON -DNSA_FUZZER_SANITIZERS="$sanitizers" -DMLIR_DIR="$prefix/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$prefix/bin/lit" "${launcher[@]}" \
    > "$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; exit 1; }
fi
cmake --build "$build" --target "$target"

# Seeds: each `// -----` chunk of each test file, comment lines dropped.
seeds=$build/$target-seeds
corpus=$build/$target-corpus
artifacts=$build/$target-artifacts
rm -rf "$seeds" "$artifacts" "$build"/fuzz-*.log
mkdir -p "$seeds" "$corpus" "$artifacts"
find "$root/test" -name '*.mlir' | sort | while read -r f; do
  awk -v out="$seeds/$(basename "$f" .mlir)" '
    /^\/\/ -----/ { n++; next }
    /^ *\/\// { next }
    { print > (out "-" n ".mlir") }' "$f"
done
# Structured seeds (0xff first, test/Fuzz/nsa-fuzz.cpp): B, T, HQ, H, Dqk,
# Dv, dtype, l, d, l', n, w, flags, initial, local, log levels, hubs, ...
printf '\xff\x01\x00\x04\x01\x10\x10\x00\x20\x10\x40\x10\x30\x00\x01\x02\x00\x00' \
  > "$seeds/structured-paper"
printf '\xff\x02\x41\x08\x02\x10\x08\x02\x08\x04\x10\x06\x10\x3f\x07\x01\x01\x01\x02\x04\x02\x05\x0a\x30\x8c\x01\x02\x08' \
  > "$seeds/structured-all"
# Flags 0x40: the gradient (and its dO); 0x80: a decoding step of 3
# queries over caches of 300 tokens and 17 compressed rows (L, Lc last);
# 0xc0: an append (L, Lc, then l, d and the tokens appended).
printf '\xff\x01\x00\x10\x01\x40\x40\x00\x20\x10\x40\x10\x30\x40\x01\x02\x00\x00' \
  > "$seeds/structured-gradient"
printf '\xff\x02\x03\x04\x02\x20\x10\x00\x20\x10\x40\x03\x40\x80\x01\x01\x00\x00\xff\x00\x00\x00\x00\x00\x00\x01\x2c\x11' \
  > "$seeds/structured-decode"
printf '\xff\x02\x00\x04\x02\x20\x10\x00\x20\x10\x40\x03\x40\xc0\x01\x01\x00\x00\xff\x00\x00\x00\x00\x00\x00\x01\x2c\x11\x20\x10\x01' \
  > "$seeds/structured-append"
echo "fuzz.sh: $(ls "$seeds" | wc -l) seed inputs"

limit=(-max_total_time="$seconds")
[[ -n $runs ]] && limit=(-runs="$runs")
parallel=()
((jobs > 1)) && parallel=(-jobs="$jobs" -workers="$jobs")
cd "$build"
# Uninstrumented libMLIR reads BumpPtrAllocator memory that the inlined,
# instrumented allocator code poisoned: manual poisoning is turned off.
export ASAN_OPTIONS=detect_leaks=0:allow_user_poisoning=0
status=0
# The sanitizer and coverage counters slow the analyses' loops 10-20x (the
# max_hops check at 16384 blocks: 0.25 s in a release build, over 5 s
# here), so an input counts as a hang past 25 s here: about 1-2.5 s of a
# release build, well inside issue 13's 5 s.
"$build/bin/$target" -dict="$root/test/Fuzz/nsa.dict" -timeout="$hang" \
  -report_slow_units="$hang" -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "${limit[@]}" "${parallel[@]}" ${NSA_FUZZ_ARGS:-} \
  "$corpus" "$seeds" 2>&1 | tee "$build/$target.log" | grep -E "^#[0-9]+ +(DONE|INITED)|stat::number_of_executed_units|nsa-fuzz:|==ERROR|SUMMARY|Test unit written|ALARM|out-of-memory|Slowest unit|Done [0-9]+ runs" || true
for log in "$build"/fuzz-*.log; do
  [[ -f $log ]] && grep -hE "stat::number_of_executed_units|nsa-fuzz:|==ERROR|Slowest unit|Done [0-9]+ runs" "$log" || true
done
if ls "$artifacts"/* >/dev/null 2>&1; then
  echo "fuzz.sh: FAILED: inputs that crash, hang or run out of memory:"
  for a in "$artifacts"/*; do echo "== $a"; head -c 2000 "$a"; echo; done
  status=1
fi
exit $status
