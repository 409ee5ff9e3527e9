#!/usr/bin/env bash
# Burn on an NVIDIA GPU, with harness programs built on another machine (a GPU machine needs no cargo):
#
#   [LLAMA=PATH [FORMS=A,B]] [HARNESS=PATH] [HARNESS_023=PATH] [HARNESS_023_TILE=PATH] [CUDA_021=PATH] [SOURCE=HF_FOLDER] \
#       bench/burn_gpu.sh OUT
#
# LLAMA: tests/burn's `llama` example (Burn 0.22.1, wgpu), run through the NVIDIA Vulkan driver on the sample
# model and, given SOURCE (a Hugging Face Llama folder), on it: bench.burn_llama writes each form, times it
# and holds its logits to torch's on qcli's decode (--agree). HARNESS: tests/burn's harness (wgpu), run on
# the capability sweep's compute cases and held to qcli's table for an NVIDIA GPU's Vulkan driver.
# HARNESS_023, HARNESS_023_TILE: tests/burn-0.23 built plain and with its `tile-kernels` feature, each run on
# Burn 0.23's sweep (decode, then a model's ops) through the NVIDIA Vulkan driver and held to the 0.23 table
# (measured on lavapipe until such a run is recorded). CUDA_021: tests/burn-0.21 built with its `cuda`
# feature, run on Burn 0.21's capability sweep (decode of every scheme, then a model's ops on each).
# Everything lands under OUT; the last lines are the tables. Run from the repository root, with qcli and
# its dependencies importable; PYTHON names the interpreter command (python3 by default).
set -u
out=${1:?usage: [LLAMA=PATH] [HARNESS=PATH] [HARNESS_023=PATH] [HARNESS_023_TILE=PATH] [CUDA_021=PATH] [SOURCE=HF_FOLDER] bench/burn_gpu.sh OUT}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

# tests/burn_harness.py finds the examples beside the harness binary of QCLI_BURN_TARGET_DIR, so the
# llama example goes where a build would put it, the harness's own name marking the place.
target=$(mktemp -d)
export QCLI_BURN_TARGET_DIR=$target PYTHONUNBUFFERED=1
python=${PYTHON:-python3}

if [ -n "${LLAMA:-}" ]; then
    mkdir -p "$target/burn-harness/debug/examples"
    cp "$LLAMA" "$target/burn-harness/debug/examples/llama"
    : >"$target/burn-harness/debug/burn-harness"
    forms=${FORMS:-q8s-b32,q4s-b32,q4f-b32-global}
    $python -m bench.burn_llama sample_weights/tiny-llama-sharded "$target/tiny" --backends wgpu --forms "$forms" \
        --prompt 32 --tokens 8 --matmul module,direct --agree 2>&1 | tee "$out/tiny-wgpu.txt"
    if [ -n "${SOURCE:-}" ]; then
        $python -m bench.burn_llama "$SOURCE" "$target/model" --backends wgpu --forms "f32,bf16,$forms" \
            --tokens 16 --matmul module,direct --agree 2>&1 | tee "$out/model-wgpu.txt"
    fi
fi

if [ -n "${HARNESS:-}" ]; then
    sweep=$target/sweep
    mkdir -p "$sweep" "$out/sweep"
    $python -m bench.burn_sweep write "$sweep"
    "$HARNESS" compute --backend wgpu "$sweep/compute.bpk" >"$sweep/computes.jsonl"
    echo "wgpu compute: exit $?, $(wc -l <"$sweep/computes.jsonl") verdicts"
    cp "$sweep/computes.jsonl" "$out/sweep/"
    $python -m bench.burn_sweep computes "$sweep" wgpu nvidia-vulkan 2>&1 | tee "$out/sweep/computes.txt"
fi

# Burn 0.23 on the NVIDIA Vulkan driver: each build's decode and a model's ops, held to the 0.23 table.
for build in 023 023_TILE; do
    harness_var=HARNESS_$build
    harness=${!harness_var:-}
    [ -n "$harness" ] || continue
    sweep=$target/sweep-$build
    mkdir -p "$sweep" "$out/sweep-$build"
    $python -m bench.burn_sweep write "$sweep" 0.23.0-pre.1
    "$harness" probe --backend wgpu "$sweep/sweep.bpk" "$sweep/burn.safetensors" >"$sweep/verdicts.jsonl"
    echo "0.23 ($build) wgpu probe: exit $?, $(wc -l <"$sweep/verdicts.jsonl") verdicts"
    "$harness" compute --backend wgpu "$sweep/compute.bpk" >"$sweep/computes.jsonl"
    echo "0.23 ($build) wgpu compute: exit $?, $(wc -l <"$sweep/computes.jsonl") verdicts"
    # the PackedU32(1) cases (tests/data/burn/wgpu-0.23*'s packed1 files)
    PYTHONPATH=. $python tests/burn-0.23/packed_dim1.py "$sweep/packed1" >/dev/null
    "$harness" probe --backend wgpu "$sweep/packed1/packed1.bpk" "$sweep/packed1.safetensors" >"$sweep/packed1-verdicts.jsonl"
    "$harness" compute --backend wgpu "$sweep/packed1/packed1.bpk" >"$sweep/packed1-computes.jsonl"
    echo "0.23 ($build) PackedU32(1): $(wc -l <"$sweep/packed1-verdicts.jsonl") verdicts, $(wc -l <"$sweep/packed1-computes.jsonl") computes"
    cp "$sweep"/{verdicts.jsonl,computes.jsonl,burn.safetensors,packed1-verdicts.jsonl,packed1-computes.jsonl,packed1.safetensors} "$out/sweep-$build/"
    $python -m bench.burn_sweep compare "$sweep" wgpu 0.23.0-pre.1 2>&1 | tail -20 | tee "$out/sweep-$build/decode.txt"
    $python -m bench.burn_sweep computes "$sweep" wgpu nvidia-vulkan 0.23.0-pre.1 2>&1 | tee "$out/sweep-$build/computes.txt"
done

if [ -n "${CUDA_021:-}" ]; then
    # Burn 0.21's CUDA backend compiles its kernels with NVRTC and the toolkit's headers (CUDA_PATH, else
    # /usr/local/cuda); the verdicts and Burn's decode come back for bench.burn_sweep to read.
    sweep=$target/sweep-0.21
    mkdir -p "$sweep"
    $python -m bench.burn_sweep write "$sweep" 0.21.0
    "$CUDA_021" probe --backend cuda "$sweep/sweep.bpk" "$sweep/burn.safetensors" >"$sweep/verdicts.jsonl"
    echo "cuda probe: exit $?, $(wc -l <"$sweep/verdicts.jsonl") verdicts"
    "$CUDA_021" compute --backend cuda "$sweep/compute.bpk" >"$sweep/computes.jsonl"
    echo "cuda compute: exit $?, $(wc -l <"$sweep/computes.jsonl") verdicts"
    mkdir -p "$out/sweep-0.21"
    cp "$sweep"/{verdicts.jsonl,computes.jsonl,burn.safetensors,expected.safetensors} "$out/sweep-0.21/"
fi
