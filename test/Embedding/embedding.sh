#!/usr/bin/env bash
# The installed package from another project: `cmake --install` of this
# build into a fresh prefix; upstream's mlir-opt runs nsa from the
# installed plugin; examples/embedding configured against the prefix with
# find_package(NSA) alone, built, and run (C++ and C API nsa-to-ptx on the
# paper's layer, the C++ JIT against the reference, its own ahead-of-time
# layer where a GPU is), each program and the plugin linked to one MLIR
# (libMLIR.so, no static MLIR archive on any link line); the installed
# Python package imported from the prefix.
#   embedding.sh <build dir> <source dir>
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache
                                         -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

echo "== cmake --install into $work/prefix"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -f "$work/prefix/lib/cmake/nsa/NSAConfig.cmake"
test -x "$work/prefix/bin/nsa-opt"
"$work/prefix/bin/nsa-opt" "$src/examples/paper_layer.mlir" --nsa-decompose \
  | grep -q nsa.select_blocks

echo "== upstream mlir-opt with the installed plugin"
mlir_opt=${NSA_MLIR_OPT:-/usr/lib/llvm-22/bin/mlir-opt}
plugin="$work/prefix/lib/libNSAPlugin.so"
"$mlir_opt" --load-dialect-plugin="$plugin" --load-pass-plugin="$plugin" \
  "$src/examples/paper_layer.mlir" \
  --pass-pipeline='builtin.module(nsa-decompose, canonicalize)' \
  | grep -q nsa.select_blocks

echo "== configure and build examples/embedding against the prefix"
cmake -G Ninja -S "$src/examples/embedding" -B "$work/consumer" \
  -DCMAKE_BUILD_TYPE=Release -DNSA_DIR="$work/prefix/lib/cmake/nsa" \
  "${launcher[@]}" > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }

echo "== one MLIR in every program"
if grep -oE 'libMLIR[A-Za-z0-9]*\.a' "$work/consumer/build.ninja" | sort -u |
   grep -v '^libMLIRCAPI'; then
  echo "static MLIR archives on a consumer's link line (above)"; exit 1
fi
for bin in "$work/consumer/embed-cpp" "$work/consumer/embed-c" \
           "$work/consumer/embed-jit" "$plugin"; do
  n=$(ldd "$bin" | grep -c 'libMLIR\.so')
  [[ $n == 1 ]] || { echo "$bin: $n libMLIR.so"; ldd "$bin"; exit 1; }
done

echo "== run"
"$work/consumer/embed-cpp" "$src/examples/paper_layer.mlir"
"$work/consumer/embed-c" "$src/examples/paper_layer.mlir"
"$work/consumer/embed-jit"
if [[ -x $work/consumer/embed-gpu ]]; then
  "$work/consumer/embed-gpu"
fi

echo "== the installed Python package"
for py in ${NSA_PYTHON:-} python3; do
  if "$py" -c "import torch; assert hasattr(torch.library, 'custom_op')" 2>/dev/null; then
    PYTHONPATH="$work/prefix/lib/python" "$py" \
      "$src/examples/embedding/torch_example.py"
    break
  fi
done
echo "embedding: passed"
