#!/usr/bin/env bash
# Everything a GPU machine should produce: the CUDA tests and every GPU benchmark. Runs from a
# checkout (PYTHONPATH=., no install needed). Result rows and logs are written under $OUT (the
# device tool's output folder) or benchmarks/results/ when $OUT is unset; copy them into
# benchmarks/results/ and commit them.
#
#   bash benchmarks/gpu_all.sh                 # every part, in order
#   bash benchmarks/gpu_all.sh tests train     # some parts
#
# On a machine whose copy of the checkout has an older .git (the device tool's), name the tree:
#   GNNACT_COMMIT=$(git rev-parse --short HEAD), computed here, in front of the command.
#
# Parts (each fits one 10-minute device call on an H100; together about 60 minutes). Seen on an
# H100 on 2026-11-23: tests 11 s; train 1.5 min; generic under 3 min; swap under 2 min;
# largest about 2 min; suite over 3.5 min for GCN alone (run GCN and SAGE in separate calls if
# the call is short).
#   evidence   the GPU targets in one call of at most 9 minutes (each step capped by `timeout`,
#              rows written step by step), ending with benchmarks/evidence.py's table of them:
#              CUDA tests; kernel throughput at every width; the step peak of the four models
#              at 2 bits against PyG fp32 on the arxiv shape; the largest graph under 16 GiB
#              (PyG, 2 bits); swap on GCNII (16 layers). For a session with little device
#              time: `bash benchmarks/gpu_all.sh evidence`, timeout_s 570.
#   speed-quick  issue 44's GPU rows in one call of at most 9 minutes (each step capped, rows
#              written case by case): the CUDA tests on 4 workers, then bench_speed.py over
#              every case eager (3 rounds of 10 steps), then compiled for Cora's GCN, GIN, GAT
#              and the arxiv shape. Needs the speed part's data_local/datasets (carried).
#              `bash benchmarks/gpu_all.sh speed-quick`, timeout_s 570. On an H200 at 68a9529:
#              375 s in all (the tests 123 s); the eager pass alone took under 3 minutes
#   quick      after a change to the kernels or a backward, in about 4 minutes: the CUDA
#              tests, kernel throughput at every width (fp32, bf16 at 2/4/8), and the step peak
#              of the four models (fp32 and 2 bits, arxiv shape); evidence.py's table; then
#              SAGE's and GCNII's 6 largest allocations at their peaks with their C++ frames
#              (peak_stacks)
#   kernels    the CUDA tests (not the tuning builds') and kernel throughput at every width,
#              float32 and bfloat16, in about 3 minutes
#   profile    Nsight Compute's full section set for the kernels of profile_kernels.py
#              (quantize fp32 and bf16 at 2 bits, fp32 at 8; dequantize fp32 at 1, 2 and 5, bf16
#              at 2): ncu_details.txt (what bounds each: throughputs, issue, occupancy, stall
#              reasons), ncu_raw.csv (every metric), ncu_sass.csv (each SASS instruction's
#              executions and stall samples) and their summary, kernel_profile.jsonl (a row a
#              kernel); about 2 minutes
#   tune       builds of cuda/quantize.cu with other compile-time settings (tune_kernels.py's
#              VARIANTS) against the default, kernel alone, bf16 and fp32 at every width, each
#              checked bit for bit against the default build, after the builds' own CUDA test
#              (NVRTC builds each variant: 7 minutes for 10 builds on an H200 at 7116a3f; over
#              4 for the default and 3 builds at 0d248a9, whose module takes longer to build;
#              `GNNACT_TUNE_DTYPES=bfloat16 ... kernels tune` took 351 s at 8254d6c). Make the
#              fastest the default.
#   tests      CUDA tests (pytest -m cuda), quantize/dequantize and fused mask-op throughput
#   train      training step time and memory, PyG fp32 vs gnnact 2/4 bits, arxiv-shaped graph,
#              all four models
#   products   the same on the ogbn-products-shaped graph (GCN, SAGE; PyG may run out of memory)
#   suite      bench_suite on the arxiv-shaped graph: pyg, gnnact 2/4/8, bf16 autocast,
#              checkpointing, save_on_cpu; GCN and SAGE, 2 seeds x 50 epochs
#   suite-gat  the same for GAT and GCNII
#   accuracy   bench_accuracy on Coauthor-Physics, Amazon-Computers and DBLP (GCN, SAGE, 3
#              seeds, 2/4 bits vs fp32). Needs the data: copy ../shared/datasets/{coauthor,
#              amazon,citation_full} into data_local/datasets/ and carry data_local.
#   fidelity   accuracy at the default (bench_fidelity.py): 15 model families written as
#              their users write them, each with its own recipe, PyG fp32 against
#              gnnact.convert(model) with no config and fixed 2 bits, 3 seeds; context and
#              step times. Needs data_local/datasets/{planetoid,amazon,heterophilous}
#              (copied from ../shared/datasets and carried). Not yet timed on a GPU; on the CPU
#              (one thread) the suite takes over an hour.
#   adaptive-<dataset>   GACT's Table 3 shape on physics, computers or dblp: GCN, GAT, GCNII x
#              {fp32, 4 bits, uniform 4 bits, adaptive 4/3/2, per-node 2}, 3 seeds
#   generic    the saved-tensor pipeline on a ResNet-18-style CNN, a VGG-style CNN (max pools)
#              and a transformer: saved bytes, step time and peak memory per compressor vs
#              fp32, and digits accuracy (3 seeds)
#   swap       GACT Table 5 on SAGE 3x256 (arxiv shape): fp32 + save_on_cpu vs gnnact 2-bit
#              swap without and with prefetch; step time, peak memory, hidden copy share;
#              then 1M products-shaped nodes, and GCNII (16 layers) at 2 bits
#   largest    the largest random graph (products' degree and widths) SAGE 3x256 trains on
#              under a 16 GB cap: PyG fp32 vs gnnact 2 bits vs 2 bits + swap; products' peak
#   peak       what is alive at a step's peak memory, by source line (allocator history):
#              the four models, PyG fp32 against 2 bits (peak_ratio_vs_fp32), arxiv shape,
#              each written three ways (modules, F.relu/F.dropout, PyG's model classes),
#              and PyG's GIN class (no twin: messages in feature chunks); models as PyG's
#              examples write them with convs that have no twin (bench_no_twin.py: GIN,
#              GraphConv, ChebConv, TAGConv, TransformerConv, AGNN, DeeperGCN), messages
#              whole and in chunks, indices compact and at their own width (step times: the
#              cost of reading each index's range, one synchronisation per tensor), full
#              arxiv shape;
#              SAGE at 2 bits on a 1M-node products shape
#   amp        mixed precision with compression: PyG fp32, fp32 + 2 bits, PyG under fp16
#              autocast, autocast + 2 bits; saved context (graph cache counted), step time and
#              peak memory, arxiv-shaped graph, all four models
#   compile    torch.compile (inductor): training step time of gnnact 2 bits against PyG fp32,
#              eager and compiled, with graph-break counts; arxiv-sized synthetic graph, GCN
#              and SAGE (the CUDA tests of tests/test_compile.py run in the tests part)
#   speed      step time beside PyG (bench_speed.py): every fidelity family and GCN on
#              CiteSeer, Computers, Physics and the arxiv shape, PyG fp32 against
#              gnnact.convert(model), eager and compiled, variants taking turns. Needs the
#              fidelity part's data_local/datasets plus amazon and coauthor. Then message
#              passing in pieces against whole by message size (bench_chunks.py: the price
#              behind chunked.MIN_MESSAGE_BYTES), and what compressing one tensor costs by
#              its size (bench_floor.py: the measurement behind config.MIN_BYTES).
#   distributed  partitioned training under NCCL, one GPU per rank (k = 1, 2, 4 as far as
#              the GPUs go; one GPU: k = 1, the NCCL path end to end): per-rank step peak,
#              exchanged bytes and step time, GCN and SAGE on the full arxiv shape, exchange
#              at 32 and 2 bits (the NCCL test of tests/test_distributed.py runs in tests)
#
# Extend this script whenever a GPU path or a GPU benchmark is added.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# A Python that has torch: $PYTHON, else the first of these that imports it (the GPU image keeps
# its torch in /opt/torch/.venv, which need not be on PATH; a symlink to it would not work).
py="${PYTHON:-}"
if [ -z "$py" ]; then
  for candidate in python python3 /opt/torch/.venv/bin/python3; do
    if "$candidate" -c "import torch" >/dev/null 2>&1; then py="$candidate"; break; fi
  done
fi
[ -n "$py" ] || { echo "no Python with torch found; set PYTHON"; exit 1; }
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
status=0
# A step of at most $1 seconds; past it, or failing, it is named and the run goes on.
capped() { local limit=$1; shift; timeout "$limit" "$@" || { echo "exit $?: $*"; status=1; }; }
# The CUDA tests (capped at $1 seconds; further arguments go to pytest), kernel throughput at
# every width and the four models' step peaks: what both `evidence` and `quick` begin with.
core_checks() {
  local cap=$1
  shift
  capped "$cap" "$py" -m pytest -m cuda -q -rs -p no:cacheprovider "$@" \
    >"$out/pytest_cuda.txt" 2>&1
  tail -15 "$out/pytest_cuda.txt"
  capped 60 "$py" benchmarks/bench_quantize.py --device cuda --bits 1 2 3 4 5 6 7 8 \
    --out "$out/quantize.jsonl"
  capped 30 "$py" benchmarks/bench_quantize.py --device cuda --dtype bfloat16 \
    --bits 2 4 8 --out "$out/quantize.jsonl"
  for model in gcn sage gat gcnii; do
    capped 45 "$py" benchmarks/profile_peak.py --device cuda --models "$model" \
      --bits 32 2 --out "$out/peak.jsonl"
  done
}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(tests tune profile train products suite suite-gat generic swap largest peak
                                 amp compile distributed accuracy fidelity speed adaptive-dblp
                                 adaptive-computers adaptive-physics)

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: ${GNNACT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  echo "parts: ${parts[*]}"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$py" -c "import torch, torch_geometric as g; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| PyG', g.__version__)"
  "$py" -c "import cupy; print('cupy', cupy.__version__)" 2>&1
} | tee -a "$out/gpu_env.txt"

for part in "${parts[@]}"; do
  echo "== $part"
  case "$part" in
    evidence)
      # Not the tuning builds' test: 6 more NVRTC builds of quantize.cu that no tune follows.
      core_checks 90 -k "not builds_tune_kernels_times"
      capped 150 "$py" benchmarks/bench_largest.py --device cuda --cap-gb 16 \
        --methods pyg gnnact2 --out "$out/largest.jsonl"
      capped 60 "$py" benchmarks/bench_swap.py --device cuda --model gcnii --epochs 5 \
        --methods gnnact2 gnnact2_swap gnnact2_swap_prefetch --out "$out/swap.jsonl"
      "$py" benchmarks/evidence.py "$out"
      ;;
    speed-quick)
      capped 150 "$py" -m pytest -m cuda -q -rs -p no:cacheprovider -n 4 \
        -k "not builds_tune_kernels_times" >"$out/pytest_cuda.txt" 2>&1
      tail -15 "$out/pytest_cuda.txt"
      if [ -d data_local/datasets ]; then
        export GNNACT_DATA="$PWD/data_local/datasets"
        capped 200 "$py" benchmarks/bench_speed.py --device cuda --rounds 3 --steps 10 \
          --out "$out/speed.jsonl" >"$out/speed_log.txt" 2>&1
        capped 170 "$py" benchmarks/bench_speed.py --device cuda --compile --rounds 3 \
          --steps 10 --cases gcn gin gat gcn-arxiv --out "$out/speed.jsonl" \
          >>"$out/speed_log.txt" 2>&1
        tail -70 "$out/speed_log.txt"
      else
        echo "no data_local/datasets: copy ../shared/datasets families there and carry it"
        status=1
      fi
      ;;
    quick)
      # The CUDA tests build 6 variants of quantize.cu (42 s on an H200 when they built 2;
      # NVRTC took 21 s a build on a 2-core CPU); tune then finds them in CuPy's cache.
      core_checks 240
      "$py" benchmarks/evidence.py "$out"
      # Last, being slow to record: what allocated the largest blocks at the peaks of SAGE
      # and of GCNII (the nearest the 10x target: 10.1x on an H200).
      for model in sage gcnii; do
        capped 90 "$py" benchmarks/profile_peak.py --device cuda --models "$model" --bits 2 \
          --stacks 6 --out "$out/peak_stacks.jsonl"
      done
      ;;
    kernels)
      capped 150 "$py" -m pytest -m cuda -q -rs -p no:cacheprovider \
        -k "not builds_tune_kernels_times" >"$out/pytest_cuda.txt" 2>&1
      tail -15 "$out/pytest_cuda.txt"
      for dtype in float32 bfloat16; do
        capped 90 "$py" benchmarks/bench_quantize.py --device cuda --dtype "$dtype" \
          --bits 1 2 3 4 5 6 7 8 --out "$out/quantize.jsonl"
      done
      ;;
    profile)
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu \
              2>/dev/null | head -1)
      if [ -n "$ncu" ]; then
        capped 240 "$ncu" --clock-control none --set full -k regex:quantize_ -f \
          -o "$out/kernels" "$py" benchmarks/profile_kernels.py
        "$ncu" --import "$out/kernels.ncu-rep" --page details >"$out/ncu_details.txt" 2>&1
        "$ncu" --import "$out/kernels.ncu-rep" --page raw --csv >"$out/ncu_raw.csv" 2>&1
        "$ncu" --import "$out/kernels.ncu-rep" --page source --csv --print-source sass \
          >"$out/ncu_sass.csv" 2>&1
        "$py" benchmarks/profile_kernels.py --summarize "$out/ncu_raw.csv" \
          --out "$out/kernel_profile.jsonl" || status=1
      else
        echo "no ncu on this machine"
        status=1
      fi
      ;;
    tune)  # rows are written width by width: a run cut short keeps what it measured
      # First the builds' own test (given noise and seeded, against the reference), which
      # compiles them: tune_kernels.py then finds them in CuPy's cache.
      capped 240 "$py" -m pytest -m cuda -q -p no:cacheprovider -k builds_tune_kernels_times \
        >"$out/pytest_variants.txt" 2>&1
      tail -3 "$out/pytest_variants.txt"
      # bfloat16 first: the quantizer furthest below a copy's bandwidth (GNNACT_TUNE_DTYPES
      # names others, e.g. bfloat16 alone in a short call).
      # shellcheck disable=SC2086
      capped 330 "$py" benchmarks/tune_kernels.py --dtypes ${GNNACT_TUNE_DTYPES:-bfloat16 float32} \
        --out "$out/tune_kernels.jsonl"
      ;;
    tests)
      "$py" -m pytest -m cuda -q -rs -p no:cacheprovider 2>&1 | tee "$out/pytest_cuda.txt"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      "$py" benchmarks/bench_quantize.py --device cuda --out "$out/quantize.jsonl" || status=1
      "$py" benchmarks/bench_quantize.py --device cuda --dtype bfloat16 --bits 2 4 8 \
        --out "$out/quantize.jsonl" || status=1
      # The widths between (3, 5, 6, 7), the ones the adaptive controller picks.
      "$py" benchmarks/bench_quantize.py --device cuda --bits 3 5 6 7 \
        --out "$out/quantize.jsonl" || status=1
      ;;
    train)
      "$py" benchmarks/bench_train.py --device cuda --models gcn sage gat gcnii --bits 2 4 \
        --out "$out/train.jsonl" || status=1
      ;;
    products)
      "$py" benchmarks/bench_train.py --device cuda --shape products --models gcn sage \
        --bits 2 4 --epochs 5 --warmup 1 --out "$out/train.jsonl" || status=1
      ;;
    suite)
      "$py" benchmarks/bench_suite.py --device cuda --models gcn sage --seeds 0 1 \
        --epochs 50 --out "$out/suite.jsonl" --summary "$out/suite_gcn_sage.md" || status=1
      ;;
    suite-gat)
      "$py" benchmarks/bench_suite.py --device cuda --models gat gcnii --seeds 0 1 \
        --epochs 50 --out "$out/suite.jsonl" --summary "$out/suite_gat_gcnii.md" || status=1
      ;;
    generic)
      "$py" benchmarks/bench_generic.py --device cuda --out "$out/generic.jsonl" || status=1
      ;;
    swap)
      "$py" benchmarks/bench_swap.py --device cuda --out "$out/swap.jsonl" || status=1
      "$py" benchmarks/bench_swap.py --device cuda --shape products --nodes 1000000 \
        --epochs 10 --out "$out/swap.jsonl" || status=1
      # 16 layers: context that outweighs one layer's backward temporaries, where swap pays.
      "$py" benchmarks/bench_swap.py --device cuda --model gcnii --epochs 10 \
        --methods gnnact2 gnnact2_swap gnnact2_swap_prefetch --out "$out/swap.jsonl" || status=1
      ;;
    largest)
      "$py" benchmarks/bench_largest.py --device cuda --cap-gb 16 --out "$out/largest.jsonl" \
        || status=1
      ;;
    peak)
      "$py" benchmarks/profile_peak.py --device cuda --models gcn sage gat gcnii gin --bits 32 2 \
        --styles module functional pyg --out "$out/peak.jsonl" || status=1
      "$py" benchmarks/profile_peak.py --device cuda --shape products --nodes 1000000 \
        --models sage --bits 2 --out "$out/peak.jsonl" || status=1
      "$py" benchmarks/bench_no_twin.py --device cuda --nodes 169343 \
        --out "$out/no_twin.jsonl" || status=1
      ;;
    amp)
      "$py" benchmarks/bench_amp.py --device cuda --amp-dtype float16 --nodes 169343 \
        --models gcn sage gat gcnii --epochs 10 --warmup 3 --out "$out/amp.jsonl" || status=1
      ;;
    compile)
      "$py" benchmarks/bench_compile.py --device cuda --nodes 169343 --models gcn sage \
        --out "$out/compile.jsonl" || status=1
      ;;
    distributed)
      gpus=$("$py" -c "import torch; print(torch.cuda.device_count())")
      ks=(1)
      [ "$gpus" -ge 2 ] && ks+=(2)
      [ "$gpus" -ge 4 ] && ks+=(4)
      for model in gcn sage; do
        "$py" benchmarks/bench_distributed.py --device cuda --full --method metis \
          --model "$model" --world-sizes "${ks[@]}" --bits 32 2 \
          --out "$out/distributed.jsonl" || status=1
      done
      ;;
    accuracy)
      if [ -d data_local/datasets ]; then
        GNNACT_DATA="$PWD/data_local/datasets" "$py" benchmarks/bench_accuracy.py \
          --device cuda --datasets physics computers dblp --models gcn sage --seeds 0 1 2 \
          --out "$out/accuracy.jsonl" || status=1
      else
        echo "no data_local/datasets: copy ../shared/datasets families there and carry it"
        status=1
      fi
      ;;
    fidelity)
      # Accuracy at the default: every family of benchmarks/fidelity_models.py, PyG fp32
      # against gnnact.convert(model) with no config and fixed 2 bits, 3 seeds, the recipes'
      # epochs. Needs planetoid, amazon and heterophilous in data_local/datasets (carried).
      if [ -d data_local/datasets ]; then
        GNNACT_DATA="$PWD/data_local/datasets" "$py" benchmarks/bench_fidelity.py \
          --device cuda --seeds 0 1 2 --out "$out/fidelity.jsonl" || status=1
      else
        echo "no data_local/datasets: copy ../shared/datasets families there and carry it"
        status=1
      fi
      ;;
    speed)
      if [ -d data_local/datasets ]; then
        GNNACT_DATA="$PWD/data_local/datasets" "$py" benchmarks/bench_speed.py \
          --device cuda --compile --out "$out/speed.jsonl" || status=1
      else
        echo "no data_local/datasets: copy ../shared/datasets families there and carry it"
        status=1
      fi
      "$py" benchmarks/bench_chunks.py --device cuda --out "$out/chunks.jsonl" || status=1
      "$py" benchmarks/bench_floor.py --device cuda --sizes 65536 1048576 16777216 67108864 \
        --out "$out/floor.jsonl" || status=1
      ;;
    adaptive-*)
      if [ -d data_local/datasets ]; then
        GNNACT_DATA="$PWD/data_local/datasets" "$py" benchmarks/bench_suite.py --device cuda \
          --graph "${part#adaptive-}" --models gcn gat gcnii --epochs 200 \
          --methods pyg gnnact4 uniform4 adaptive4 adaptive3 adaptive2 pernode2 \
          --out "$out/suite.jsonl" --summary "$out/suite_${part}.md" || status=1
      else
        echo "no data_local/datasets: copy ../shared/datasets families there and carry it"
        status=1
      fi
      ;;
    *)
      echo "unknown part: $part"
      status=1
      ;;
  esac
done

exit $status
