#!/usr/bin/env bash
# On the GPU machine: (optionally) train the built-in Shakespeare model, then check it on CUDA —
# perplexity on the held-out text (CUDA and CPU) against PyTorch's, logits CUDA vs CPU, and both
# against transformers. Carry .debs and .data (tinyshakespeare.txt).
#   bash scripts/gpu-shakespeare.sh [--train "TRAIN ARGS"] [MODEL.gguf]
set -uo pipefail
out=${OUT:-/tmp/loom-out}; mkdir -p "$out"
train_args=""
if [[ ${1:-} == --train ]]; then train_args=$2; shift 2; fi
model=${1:-models/loom-shakespeare-f16.gguf}
export PYTHONUNBUFFERED=1
if [[ -n $train_args ]]; then
  mkdir -p /tmp/tr
  python3 tools/train_shakespeare.py --data .data/tinyshakespeare.txt --out /tmp/tr $train_args >"$out/train.log" 2>&1 \
    || { tail -30 "$out/train.log"; exit 1; }
  grep -E "^(checkpoint|heldout|self-check|train_shakespeare)" "$out/train.log"
  (cd /tmp/tr && split -b 15M loom-shakespeare-f16.gguf "$out/model.part." && cp heldout_ids.txt heldout_sample.txt results.json "$out/")
  model=/tmp/tr/loom-shakespeare-f16.gguf
fi
prefix=/tmp/loom-deps; mkdir -p $prefix
for f in .debs/*.deb; do dpkg -x "$f" $prefix; done
export CMAKE_PREFIX_PATH=$prefix/usr PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig
export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu
cmake -S . -B build-shk -G Ninja -DLOOM_CUDA=ON -DLOOM_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null \
  && cmake --build build-shk -j16 >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
bin=build-shk/bin
python3 -c "t=open('.data/tinyshakespeare.txt').read(); open('/tmp/heldout.txt','w').write(t[int(0.9*len(t)):])"
for be in cuda cpu; do
  echo "perplexity $be: $($bin/loom perplexity -m "$model" -f /tmp/heldout.txt -c 256 --backend $be -t 16 2>&1 | grep -E 'PPL|tokens/s' | tr '\n' ' ')"
done
prompt=$(head -c 500 /tmp/heldout.txt)  # ~170 tokens: inside the 256 context
for be in cuda cpu; do
  $bin/loom run -m "$model" --backend $be -t 16 -p "$prompt" -n 1 --temp 0 --dump-logits /tmp/$be.bin >/dev/null 2>&1
done
python3 tools/compare_logits.py /tmp/cuda.bin /tmp/cpu.bin --threshold 1e-4 --label "shakespeare cuda vs cpu"
python3 tools/hf_reference.py --model "$model" --loom-logits /tmp/cuda.bin --threshold 1e-4
python3 tools/hf_reference.py --model "$model" --loom-logits /tmp/cpu.bin --threshold 1e-4
$bin/loom run -m "$model" --backend cuda -p "ROMEO:" -n 80 -s 1 2>&1 | tail -12
