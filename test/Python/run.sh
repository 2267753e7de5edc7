#!/usr/bin/env bash
# Runs one test file of the Python package with the first interpreter that
# has torch: $NSA_PYTHON, Debian's /usr/bin/python3 (python3-torch, which
# scripts/setup.sh installs), then python3 on PATH. Exits 77 (skipped) where
# none has torch.
#   run.sh <package dir> <test file>
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for py in ${NSA_PYTHON:-} /usr/bin/python3 python3; do
  if "$py" -c "import torch" 2>/dev/null; then
    cd "$here"
    NSA_PYTHON_DIR=$1 exec "$py" "$here/$2"
  fi
done
echo "no Python with torch: skipped"
exit 77
