#!/usr/bin/env bash
# The demo's GPU part (run by scripts/demo.sh where a GPU is present; runs
# on its own on a GPU machine without MLIR, over a build/ made elsewhere):
# the paper's heads and dims compiled ahead of time by nsa-to-ptx, checked
# against the float64 reference (relative L2 error per branch and layer),
# then the paper layer (HQ 64, H 4, Dqk 192, Dv 128) at T = 8192 timed
# against PyTorch SDPA's cuDNN dense causal attention where torch is found.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${NSA_BUILD_DIR:-$root/build}
T=${NSA_DEMO_TOKENS:-8192}
echo "== GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
echo "== error against the float64 reference (bf16; tolerance 1e-2)"
NSA_GPU_TEST_FILTER=PaperLayerG16 "$build/test/GPU/nsa-gpu-layer-tests"
echo "== time against dense attention, T = $T, B = 1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/bench/nsa-bench" --reps=3 --configs=Dqk192 "$T" > "$tmp/nsa.jsonl"
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 "$root/bench/sdpa.py" "$T" | grep Dqk192 > "$tmp/sdpa.jsonl"
  python3 - "$tmp/nsa.jsonl" "$tmp/sdpa.jsonl" <<'PY'
import json, sys
nsa, sdpa = (json.loads(open(p).readline()) for p in sys.argv[1:])
print(f"nsa layer (all three branches): {nsa['ms']:.2f} ms, "
      f"{nsa['tflops']:.2f} TF/s useful")
print(f"cuDNN dense causal attention:   {sdpa['ms']:.2f} ms, "
      f"{sdpa['tflops']:.2f} TF/s")
print(f"nsa / dense time: {nsa['ms'] / sdpa['ms']:.1f}x")
PY
else
  cat "$tmp/nsa.jsonl"
  echo "(PyTorch with CUDA not found: no dense comparison)"
fi
