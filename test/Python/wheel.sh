#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment, then the installed
# package alone (its libraries from the wheel's nsa/lib) runs a CPU layer
# against the float64 reference, outside the source and build trees.
#   wheel.sh <build dir> <source dir>
# NSA_PYTHON: the Python with torch (the build's venv). The wheel is built
# by the in-tree backend (pyproject.toml) over this build folder
# (NSA_BUILD_DIR), so nothing is compiled again; torch comes from
# NSA_PYTHON's site-packages (a .pth file), not from a second download.
set -euo pipefail
build=$1
src=$2
python=${NSA_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

base=$("$python" -c "import sys; print(sys._base_executable)")
"$base" -m venv "$work/venv"
NSA_BUILD_DIR=$build "$work/venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-deps "$src" > "$work/pip.log" 2>&1 ||
  { cat "$work/pip.log"; exit 1; }

site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
test -f "$site/nsa/lib/libNSA-C.so"
test -f "$site/nsa/lib/libnsa_error.so"
"$python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
  > "$site/torch_from_build_venv.pth"

cd "$work"
"$work/venv/bin/python" - "$site" <<'PY'
import sys, torch, nsa
site = sys.argv[1]
assert nsa.__file__.startswith(site), nsa.__file__
assert nsa._native.library_dir() == f"{site}/nsa/lib", nsa._native.library_dir()
g = torch.Generator().manual_seed(0)
B, T, HQ, H, D = 1, 77, 4, 2, 16
q = torch.randn(B, T, HQ, D, generator=g)
k = torch.randn(B, T, H, D, generator=g)
v = torch.randn(B, T, H, D, generator=g)
gates = torch.randn(B, T, HQ, 3, generator=g)
config = nsa.NSAConfig(cmp_block=8, cmp_stride=4, slc_block=16,
                       num_selected=4, window=24)
out = nsa.sparse_attention(q, k, v, gates, config)
ref = nsa.reference(q, k, v, gates, config)
err = float((out.double() - ref).norm() / ref.norm())
print(f"wheel: nsa from {site}: CPU layer vs reference, rel. L2 {err:.2e}")
assert err <= 1e-5, err
PY
echo "wheel: passed"
