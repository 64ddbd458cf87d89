#!/usr/bin/env bash
# The GPU check, in one call of the device tool (one NVIDIA H200, no network):
#
#   device tool run: command "bash benchmarks/gpu_check.sh", carry [".gpu-wheels"], timeout_s 600
#
# Build .gpu-wheels/ here first (bash benchmarks/gpu_wheels.sh, or make gpu-wheels). Stages, each
# under its own `timeout`, each run whatever happened to the ones before it:
#
#   install        our missing packages from .gpu-wheels/ (pip --no-index --no-deps --target)
#   env            versions, GPU, nvidia-smi, pip list                     -> env.txt
#   kernel_tests   tests/test_kernels.py on the GPU (PE_INTERP_TEST_DEVICE=cuda, pytest-xdist)
#                                                                          -> kernel_tests.txt
#   attention      benchmarks/attention_gpu.py: triton, sdpa, eager; paper and long shapes;
#                  rope, alibi, t5; fwd and fwd+bwd; errors vs float64    -> attention_gpu.json
#   model_step     benchmarks/model_step.py --device cuda --amp: bf16 training steps at the
#                  paper's size (batch 512 x 120): baseline, eager, sdpa, triton
#                                                                          -> model_step_gpu.json
#   train          pe-interp train --preset paper --encoding rope --device cuda, epochs capped
#                                                                          -> train_rope.json
#   attention_flex benchmarks/attention_gpu.py --contenders flex (torch.compile; last, as it
#                  compiles longest), paper shape                          -> attention_flex.json
#
# Everything lands in $OUT (the device tool's output folder; ./gpu-out when unset) as at most
# 8 files, the tool's limit: the 7 above, summary.txt (the table printed at the end, rewritten
# after every stage) and logs.tar.gz (every stage's full log, the JUnit XML, the training run's
# config and metrics). The whole run keeps to GPU_CHECK_BUDGET seconds (default 500; 1200 in a
# rehearsal): a stage gets at most its own timeout and what is left of the budget, and is
# skipped when under 20 s are left. Expected on the H200 (estimates, see benchmarks/RESULTS.md):
# install 10 s, env 10 s, kernel_tests 60-100 s, attention 60-90 s, model_step 40 s, train
# 60-90 s, attention_flex 60-100 s: 5-7 minutes.
#
# Why no venv: the machine's python3 is itself a venv (/opt/torch/.venv), and a venv made from
# a venv with --system-site-packages sees the base interpreter's site-packages, not that venv's:
# torch and triton would vanish. So the wheels go to a --target folder put on PYTHONPATH, ahead
# of the machine's packages, and the checkout itself is on PYTHONPATH (no install of pe-interp:
# the code that travelled is the code that runs).
#
# Knobs (environment): PYTHON (default python3), OUT, GPU_CHECK_BUDGET, GPU_CHECK_ONLY (comma
# list of stages), GPU_CHECK_EPOCHS (train, default 12), GPU_CHECK_XDIST (pytest workers,
# default 12), GPU_CHECK_T_<STAGE> (a stage's timeout, e.g. GPU_CHECK_T_TRAIN=150).
# GPU_CHECK_REHEARSAL=1 runs every stage on CPU at toy sizes (Triton interpreter, --cpu-smoke),
# to test this script, the wheelhouse and the install path on a machine without a GPU.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/pe-interp-gpu-check}"
WHEELS="${GPU_WHEELS_DIR:-$ROOT/.gpu-wheels}"
REHEARSAL="${GPU_CHECK_REHEARSAL:-0}"
if [ "$REHEARSAL" = 1 ]; then  # the interpreter on a small CPU: slow, but only the paths count
    BUDGET="${GPU_CHECK_BUDGET:-1200}"
else
    BUDGET="${GPU_CHECK_BUDGET:-500}"
fi
EPOCHS="${GPU_CHECK_EPOCHS:-12}"
XDIST="${GPU_CHECK_XDIST:-12}"
ONLY="${GPU_CHECK_ONLY:-}"
START="$(date +%s)"

case "$WORK" in /|/tmp|/tmp/|"$ROOT"|"$HOME") echo "gpu_check: refusing GPU_CHECK_WORK=$WORK" >&2; exit 2 ;; esac
rm -rf "$WORK"
mkdir -p "$WORK/logs"
SITE="$WORK/site"
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there
# Kept between runs on the same (warm) machine: a rerun loads the kernels instead of compiling.
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-${TMPDIR:-/tmp}/pe-interp-triton-cache}"
export PY OUT WORK WHEELS SITE REHEARSAL EPOCHS XDIST ROOT
if [ "$REHEARSAL" = 1 ]; then
    export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
fi
STAGES_TSV="$WORK/stages.tsv"
: >"$STAGES_TSV"

# ---- stages (functions, run under `timeout` in a child bash) ----------------------------------

stage_install() {
    if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "no wheels in $WHEELS (bring them with carry [\".gpu-wheels\"]); trying the machine's packages"
    else
        ls -l "$WHEELS"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --disable-pip-version-check --target "$SITE" "$WHEELS"/*.whl || return 1
    fi
    # Every module the later stages import (pe_interp's closure, pytest); a miss fails here.
    "$PY" - <<'EOF'
import importlib, sys
mods = ["torch", "triton", "numpy", "transformers", "huggingface_hub", "datasets", "dill",
        "multiprocess", "transformer_lens", "jaxtyping", "einops", "safetensors", "tqdm", "yaml",
        "pytest", "pe_interp", "pe_interp.cli", "pe_interp.commands.train", "pe_interp.kernels"]
bad = []
for m in mods:
    try:
        mod = importlib.import_module(m)
        print(f"  {m:<26} {getattr(mod, '__version__', '')}  {getattr(mod, '__file__', '')}")
    except Exception as e:
        bad.append(m)
        print(f"  {m:<26} IMPORT FAILED: {type(e).__name__}: {e}")
sys.exit(1 if bad else 0)
EOF
}

stage_env() {
    {
        echo "# gpu_check env, $(date -u +%FT%TZ), rehearsal=$REHEARSAL"
        echo "git: $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo '?') $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files"
        uname -a
        echo "cpus: $(nproc --all)"
        "$PY" - <<'EOF'
import platform, torch
print("python", platform.python_version(), platform.python_implementation())
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
try:
    import triton
    print("triton", triton.__version__)
except Exception as e:
    print("triton: not importable:", e)
print("cuda available:", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
          f"{p.total_memory / 2**30:.1f} GiB")
EOF
        echo "## nvidia-smi"
        if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "nvidia-smi not found"; fi
        echo "## pip list"
        "$PY" -m pip list --disable-pip-version-check 2>/dev/null
    } >"$OUT/env.txt" 2>&1
    local rc=$?
    sed -n '1,/^## pip list/p' "$OUT/env.txt"
    return $rc
}

stage_kernel_tests() {
    local args=(-q -p no:cacheprovider -rfEs --durations=10 --junitxml="$WORK/kernel_tests.xml")
    if "$PY" -c "import xdist" 2>/dev/null && [ "$XDIST" -gt 1 ]; then
        args+=(-n "$XDIST")  # each worker compiles its own kernels: ~150 specialisations in all
    fi
    if "$PY" -c "import pytest_timeout" 2>/dev/null; then
        args+=(--timeout 150)
    fi
    if [ "$REHEARSAL" = 1 ]; then
        export PE_INTERP_TEST_DEVICE=cpu
        args+=(-k "rope-causal-padded or validation or import or lse and alibi_t5 or matches_eager and t5")
    else
        export PE_INTERP_TEST_DEVICE=cuda  # an error, not a CPU fallback, if CUDA is missing
    fi
    "$PY" -m pytest tests/test_kernels.py "${args[@]}" 2>&1 | tee "$OUT/kernel_tests.txt"
    return "${PIPESTATUS[0]}"
}

stage_attention() {
    if [ "$REHEARSAL" = 1 ]; then
        "$PY" benchmarks/attention_gpu.py --cpu-smoke --contenders triton,sdpa,eager \
            --encodings rope,t5 --json "$OUT/attention_gpu.json"
        return
    fi
    # Compile the Triton kernels of every (shape, encoding) in parallel processes first: they
    # land in Triton's on-disk cache, so the timed run below loads them instead of compiling
    # ~24 kernels one after another (its first_call_s is then load time, not compile time).
    local t0 pids=() shape enc
    t0="$(date +%s)"
    for shape in paper long; do
        for enc in rope alibi t5; do
            timeout --foreground -k 5 100 "$PY" benchmarks/attention_gpu.py --shapes "$shape" --encodings "$enc" --contenders triton \
                --reps 1 --warmup 0 --no-err --json "$WORK/prewarm-$shape-$enc.json" \
                >"$WORK/logs/prewarm-$shape-$enc.log" 2>&1 &
            pids+=($!)
        done
    done
    wait "${pids[@]}"
    echo "prewarm (parallel Triton compiles): $(( $(date +%s) - t0 )) s"
    "$PY" benchmarks/attention_gpu.py --contenders triton,sdpa,eager --json "$OUT/attention_gpu.json" &&
        [ -f "$OUT/attention_gpu.json" ]  # it exits 0 without writing when CUDA is missing
}

stage_model_step() {
    if [ "$REHEARSAL" = 1 ]; then
        "$PY" benchmarks/model_step.py --device cpu --batch 4 --seq 16 --steps 1 --repeats 1 \
            --contenders baseline,eager,sdpa --json "$OUT/model_step_gpu.json"
        return
    fi
    "$PY" benchmarks/model_step.py --device cuda --amp --batch 512 --seq 120 --steps 10 \
        --repeats 5 --warmup 3 --json "$OUT/model_step_gpu.json"
}

stage_train() {
    local run="$WORK/train-rope"
    local args=(train --preset paper --encoding rope --out "$run" --no-progress)
    if [ "$REHEARSAL" = 1 ]; then
        args+=(--device cpu --epochs 1 --n-train 128 --n-test 64 --batch-size 64)
    else
        args+=(--device cuda --epochs "$EPOCHS")
    fi
    "$PY" -m pe_interp.cli "${args[@]}"
}

post_train() {  # run after the stage, also after a timeout: metrics.jsonl has a line per epoch
    "$PY" - "$WORK/train-rope" "$OUT/train_rope.json" "$1" <<'EOF'
import json, sys
from pathlib import Path
run, out, status = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
read = lambda p: p.read_text() if p.exists() else ""
metrics = [json.loads(l) for l in read(run / "metrics.jsonl").splitlines() if l.strip()]
config = json.loads(read(run / "config.json") or "null")
res = {"status": status, "epochs_done": len(metrics), "metrics": metrics, "config": config}
if metrics:
    s = [m["seconds"] for m in metrics]
    res["seconds_per_epoch"] = [round(b - a, 3) for a, b in zip([0.0] + s[:-1], s)]
out.write_text(json.dumps(res, indent=1))
print(f"train: {len(metrics)} evaluations recorded -> {out}")
EOF
}

stage_attention_flex() {
    if [ "$REHEARSAL" = 1 ]; then
        "$PY" benchmarks/attention_gpu.py --cpu-smoke --contenders flex --json "$OUT/attention_flex.json"
        return
    fi
    "$PY" benchmarks/attention_gpu.py --contenders flex --shapes paper --json "$OUT/attention_flex.json" &&
        [ -f "$OUT/attention_flex.json" ]
}

export -f stage_install stage_env stage_kernel_tests stage_attention stage_model_step stage_train \
    stage_attention_flex post_train

# ---- runner -------------------------------------------------------------------------------------

summarise() {
    "$PY" "$ROOT/benchmarks/gpu_check_summary.py" "$STAGES_TSV" "$OUT" >"$OUT/summary.txt" 2>&1 \
        || { echo "(summary script failed; raw stages:)"; cat "$STAGES_TSV"; } >>"$OUT/summary.txt"
    cp "$STAGES_TSV" "$WORK/logs/stages.tsv"
    [ -f "$WORK/kernel_tests.xml" ] && cp "$WORK/kernel_tests.xml" "$WORK/logs/"
    for f in config.json metrics.jsonl; do
        [ -f "$WORK/train-rope/$f" ] && cp "$WORK/train-rope/$f" "$WORK/logs/train-rope-$f"
    done
    tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs 2>/dev/null
}

run_stage() {  # name default_timeout
    local name="$1" t="$2" now left t0 rc status
    local var="GPU_CHECK_T_${name^^}"
    t="${!var:-$t}"
    if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then
        printf '%s\tSKIP\t0\t%s\n' "$name" "not in GPU_CHECK_ONLY" >>"$STAGES_TSV"
        return
    fi
    now="$(date +%s)"
    left=$((START + BUDGET - now))
    if [ "$left" -lt 20 ]; then
        printf '%s\tSKIP\t0\t%s\n' "$name" "budget spent" >>"$STAGES_TSV"
        echo "=== [$name] skipped: ${left} s of the ${BUDGET} s budget left"
        summarise
        return
    fi
    [ "$t" -gt $((left - 5)) ] && t=$((left - 5))
    echo "=== [$name] (timeout ${t} s, $(( now - START )) s into the run)"
    t0="$(date +%s)"
    timeout -k 10 "$t" bash -c "stage_$name" >"$WORK/logs/$name.log" 2>&1
    rc=$?
    case "$rc" in
        0) status=ok ;;
        124 | 137) status=TIMEOUT ;;
        *) status="FAIL($rc)" ;;
    esac
    if declare -F "post_$name" >/dev/null; then
        timeout -k 5 30 bash -c "post_$name '$status'" >>"$WORK/logs/$name.log" 2>&1
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "timeout ${t}s" >>"$STAGES_TSV"
    tail -n 15 "$WORK/logs/$name.log" | cut -c1-200
    echo "=== [$name] $status in $(( $(date +%s) - t0 )) s"
    summarise
}

echo "gpu_check: root $ROOT, out $OUT, python $PY, budget ${BUDGET} s, rehearsal $REHEARSAL"
run_stage install 60
run_stage env 40
run_stage kernel_tests 150
run_stage attention 150
run_stage model_step 90
run_stage train 150
run_stage attention_flex 150
summarise
echo
cat "$OUT/summary.txt"
echo "total $(( $(date +%s) - START )) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
