#!/usr/bin/env bash
# Installs what nsa needs on Debian 12 (only the missing packages, saying
# which), configures with CMake + Ninja and builds incrementally.
# Used by scripts/demo.sh and scripts/test.sh; safe to run again.
#   NSA_BUILD_DIR   build directory (default: <repo>/build)
#   LLVM_PREFIX     LLVM/MLIR 22 prefix (default: llvm-config-22 --prefix)
#   CUDA_HOME       CUDA toolkit (default: the directory of nvcc, /usr/local/cuda)
#   NSA_PYTHON      the Python whose torch the package's tests use (default:
#                   <build>/venv, made here: torch and pytest from PyPI)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${NSA_BUILD_DIR:-$root/build}
die() { echo "nsa setup: error: $*" >&2; exit 1; }

# python3-venv: the Python package's test environment (below);
# clang-22 + libclang-rt-22-dev: the fuzzer (scripts/fuzz.sh).
packages=(cmake ninja-build ccache g++ libgtest-dev
          llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
          python3-venv clang-22 libclang-rt-22-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$p")
done
if ((${#missing[@]})); then
  echo "nsa setup: installing missing Debian packages: ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root or sudo to install: ${missing[*]}"
    sudo=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || die "apt-get update failed"
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "could not install ${missing[*]} (is the Debian security suite with LLVM 22 reachable?)"
fi

prefix=${LLVM_PREFIX:-$(llvm-config-22 --prefix 2>/dev/null || true)}
[[ -d $prefix/lib/cmake/mlir ]] || die "MLIR 22 not found (looked in '$prefix'); set LLVM_PREFIX"

cuda_args=()
cuda=${CUDA_HOME:-}
if [[ -z $cuda ]]; then
  if nvcc=$(command -v nvcc 2>/dev/null); then cuda=$(dirname "$(dirname "$nvcc")")
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then cuda=/usr/local/cuda; fi
fi
if [[ -n $cuda && -x $cuda/bin/ptxas ]]; then
  cuda_args=(-DCUDAToolkit_ROOT="$cuda")
else
  echo "nsa setup: note: no CUDA toolkit found (set CUDA_HOME); ptxas tests are skipped"
fi

# The Python package needs torch >= 2.5 (torch.library.custom_op); its
# tests run in a virtual environment of the build with a current torch
# (the CPU use of PyPI's wheel), pytest and hypothesis (the hostile-input
# harness).
mkdir -p "$build"
python=${NSA_PYTHON:-$build/venv/bin/python}
if [[ -z ${NSA_PYTHON:-} ]] &&
   ! "$python" -c "import torch, pytest, hypothesis; assert hasattr(torch.library, 'custom_op')" 2>/dev/null; then
  echo "nsa setup: making $build/venv (torch >= 2.5, pytest and hypothesis from PyPI)"
  base=$(command -v python3 || echo /usr/bin/python3)
  "$base" -m venv "$build/venv" || /usr/bin/python3 -m venv "$build/venv" ||
    die "cannot make a Python virtual environment in $build/venv"
  "$build/venv/bin/python" -m pip install -q --disable-pip-version-check \
    "torch>=2.5" numpy pytest hypothesis ||
    die "pip could not install torch, pytest and hypothesis (is PyPI reachable?)"
fi

if [[ ! -f $build/build.ninja ]]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR="$prefix/lib/cmake/mlir" \
    -DLLVM_EXTERNAL_LIT="$prefix/bin/lit" \
    -DNSA_PYTHON="$python" \
    "${launcher[@]}" "${cuda_args[@]}" >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log"; die "CMake configuration failed"; }
fi
cmake --build "$build" || die "build failed"
