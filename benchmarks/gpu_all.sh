#!/usr/bin/env bash
# Everything a GPU machine should produce, in one device call: the CUDA tests and every GPU
# benchmark. Runs from a checkout (PYTHONPATH=., no install needed). Result rows and logs are
# written under $OUT (the device tool's output folder) or benchmarks/results/ when $OUT is unset;
# copy them into benchmarks/results/ and commit them.
#
#   bash benchmarks/gpu_all.sh
#
# Extend this script whenever a GPU path or a GPU benchmark is added.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
status=0

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python -c "import torch, torch_geometric as g; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| PyG', g.__version__)"
  python -c "import cupy; print('cupy', cupy.__version__)" 2>&1
} | tee "$out/gpu_env.txt"

echo "== CUDA tests"
python -m pytest -m cuda -q -rs -p no:cacheprovider 2>&1 | tee "$out/pytest_cuda.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== quantize/dequantize throughput"
python benchmarks/bench_quantize.py --device cuda --out "$out/quantize.jsonl" || status=1
python benchmarks/bench_quantize.py --device cuda --dtype bfloat16 --bits 2 4 8 \
  --out "$out/quantize.jsonl" || status=1

echo "== training step: PyG fp32 vs gnnact side by side (arxiv-shaped synthetic graph)"
python benchmarks/bench_train.py --device cuda --models gcn sage gat gcnii --bits 2 4 \
  --out "$out/train.jsonl" || status=1

exit $status
