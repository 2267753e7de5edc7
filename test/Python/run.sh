#!/usr/bin/env bash
# Runs one test file of the Python package with the first interpreter that
# has torch 2.5 or newer: $NSA_PYTHON (ctest sets it: <build>/venv, which
# scripts/setup.sh makes), then python3 on PATH. Exits 77 (skipped) where
# none has.
#   run.sh <package dir> <test file>
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for py in ${NSA_PYTHON:-} python3; do
  if "$py" -c "import torch; assert hasattr(torch.library, 'custom_op')" 2>/dev/null; then
    cd "$here"
    NSA_PYTHON_DIR=$1 exec "$py" "$here/$2"
  fi
done
echo "no Python with torch: skipped"
exit 77
