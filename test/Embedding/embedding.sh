#!/usr/bin/env bash
# The installed package from another project: `cmake --install` of this
# build into a fresh prefix, then examples/embedding configured against it
# with find_package(NSA) alone, built, and run (C++ and C API nsa-to-ptx on
# the paper's layer; its own ahead-of-time layer, run where a GPU is); the
# installed Python package imported from the prefix.
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

echo "== configure and build examples/embedding against the prefix"
cmake -G Ninja -S "$src/examples/embedding" -B "$work/consumer" \
  -DCMAKE_BUILD_TYPE=Release -DNSA_DIR="$work/prefix/lib/cmake/nsa" \
  "${launcher[@]}" > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }

echo "== run"
"$work/consumer/embed-cpp" "$src/examples/paper_layer.mlir"
"$work/consumer/embed-c" "$src/examples/paper_layer.mlir"
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
