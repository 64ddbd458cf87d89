#!/usr/bin/env bash
# Build .gpu-wheels/: the Python packages that benchmarks/gpu_check.sh needs on the lent GPU
# machine and that its image lacks. That machine has Python 3.12 with torch 2.11 and triton 3.6
# (and transformers, numpy, jaxtyping, safetensors, einops, tqdm, pyyaml, pytest...), but no
# network, so the missing ones travel with the checkout (the device tool's `carry`, 64 MiB in all).
#
#   bash benchmarks/gpu_wheels.sh            # or: make gpu-wheels
#
# The set is the import closure of the code the GPU check runs (pe_interp and its training,
# the kernel tests, benchmarks/attention_gpu.py and model_step.py), minus what the image has:
# `import transformer_lens` (pe_interp/models/hooked/model.py) imports `datasets`, which imports dill and
# multiprocess. Nothing else (not wandb, beartype, typeguard, fancy-einsum, circuitsvis) is
# imported on those paths. Versions are our lock's (requirements-lock.txt). Installed there with
# --no-deps, so pip never reaches for torch, triton or an nvidia-* wheel; this script refuses
# to keep any such wheel. Our own package is not a wheel: the check puts the checkout on
# PYTHONPATH, so it always runs the code that travelled.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${GPU_WHEELS_DIR:-$ROOT/.gpu-wheels}"
PY="${PYTHON:-python3}"
MAX_MIB="${GPU_WHEELS_MAX_MIB:-16}"  # leaves the checkout most of the 64 MiB

# name==version, one per line; the lock's pins.
WHEELS=(
    transformer-lens==4.3.0
    datasets==5.2.0
    dill==0.4.1
    multiprocess==0.70.19
)
for spec in "${WHEELS[@]}"; do  # keep the list in step with the lock
    name="${spec%%==*}"
    locked="$(grep -i "^${name}==" "$ROOT/requirements-lock.txt" || true)"
    if [ -n "$locked" ] && [ "${locked,,}" != "${spec,,}" ]; then
        echo "gpu_wheels: $spec differs from requirements-lock.txt ($locked)" >&2
        exit 1
    fi
done

rm -rf "$DEST"
mkdir -p "$DEST"
# The GPU machine's interpreter: CPython 3.12 on x86-64 Linux. --no-deps: only what is listed.
"$PY" -m pip download -q --no-deps --only-binary=:all: --no-cache-dir \
    --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -d "$DEST" "${WHEELS[@]}"

bad="$(cd "$DEST" && ls | grep -iE '^(torch|triton|nvidia|cuda)[-_]' || true)"
if [ -n "$bad" ]; then
    echo "gpu_wheels: refusing to carry $bad (the GPU machine has its own)" >&2
    exit 1
fi
n="$(ls "$DEST"/*.whl | wc -l)"
if [ "$n" -ne "${#WHEELS[@]}" ]; then
    echo "gpu_wheels: expected ${#WHEELS[@]} wheels, got $n" >&2
    exit 1
fi
kib="$(du -sk "$DEST" | cut -f1)"
if [ "$kib" -gt $((MAX_MIB * 1024)) ]; then
    echo "gpu_wheels: $DEST is ${kib} KiB, over ${MAX_MIB} MiB" >&2
    exit 1
fi
(cd "$DEST" && ls -l *.whl | awk '{printf "  %8.0f KiB  %s\n", $5/1024, $9}')
echo "gpu_wheels: $n wheels, ${kib} KiB in $DEST"
echo "gpu_wheels: on the device tool: carry [\".gpu-wheels\"], command: bash benchmarks/gpu_check.sh"
