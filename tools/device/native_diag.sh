#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Root cause of the crash a CUDA build of llama-cpp-python and onnxruntime hit in one process (docs/native-libraries.md).
# Runs on the GPU machine with the CUDA llama_cpp importable; each case in its own child process, rc and the last
# lines recorded in $OUT/native_diag.txt. ORT wheels of other versions may be carried in .ortwhl/.
# Usage: bash tools/device/native_diag.sh
set -uo pipefail
LOG="${OUT:-/tmp}/native_diag.txt"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY=python3
site=$($PY -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('llama_cpp').origin))")
echo "llama_cpp at $site" | tee -a "$LOG"
case_() {  # name, python code (env in front via `env`)
  local name=$1; shift
  echo "=== $name" >> "$LOG"
  timeout 120 "$@" > /tmp/case.out 2>&1; rc=$?
  echo "rc=$rc" >> "$LOG"; grep -v '^llama_\|^load_tensors\|^print_info\|^load:\|^ggml_\|^\s*$\|frozen importlib' /tmp/case.out | tail -${TAILN:-6} >> "$LOG"
  echo "$name rc=$rc"
}
mkdir -p /tmp/diag
GG=/tmp/diag/tiny.gguf
$PY - <<'PY' >> "$LOG" 2>&1
import sys, torch; sys.path.insert(0, ".")
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
d = Path("/tmp/diag/hf"); d.mkdir(parents=True, exist_ok=True)
tok = Tokenizer(models.BPE()); tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False); tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(Path("edgesdk/data/ppl_text.txt").read_text().split("\n"), trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>"); fast.save_pretrained(d)
torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=640, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)).save_pretrained(d)
from edgesdk.formats.gguf.convert import convert_hf_to_gguf
convert_hf_to_gguf(d, Path("/tmp/diag/tiny.gguf"), name="tiny")
print("converted", Path("/tmp/diag/tiny.gguf").stat().st_size)
PY
ls -la /etc/machine-id /var/lib/dbus/machine-id >> "$LOG" 2>&1
LOAD="from llama_cpp import Llama; m = Llama('$GG', n_gpu_layers=-1, verbose=False); print('gen', repr(m.create_completion('the', max_tokens=4, temperature=0)['choices'][0]['text']))"
ORT="import onnxruntime as o; print('ort', o.__version__)"
case_ llama_then_ort $PY -X faulthandler -c "import llama_cpp; $ORT"
case_ llama_then_ort_notelemetry env ORT_DISABLE_TELEMETRY=1 $PY -X faulthandler -c "import llama_cpp; $ORT"
for w in .ortwhl/*.whl; do
  v=$(basename "$w" | cut -d- -f2); $PY -m pip install -q --no-deps --no-compile --target /tmp/ort$v "$w"
  case_ "llama_then_ort$v" env PYTHONPATH=/tmp/ort$v:$PYTHONPATH $PY -X faulthandler -c "import llama_cpp; $ORT"
done
case_ numpy_then_llama_load $PY -X faulthandler -c "import numpy; $LOAD"
case_ llama_load_alone $PY -X faulthandler -c "$LOAD"
case_ ort_then_llama_load $PY -X faulthandler -c "$ORT; $LOAD"
case_ llama_load_then_ort_notelemetry env ORT_DISABLE_TELEMETRY=1 $PY -X faulthandler -c "$LOAD; $ORT"
case_ torch_cuda_then_llama_load $PY -X faulthandler -c "import torch; torch.zeros(1, device='cuda'); $LOAD"
case_ llama_load_then_torch_cuda $PY -X faulthandler -c "$LOAD; import torch; print(torch.zeros(1, device='cuda') + 1)"
case_ torch_then_llama_then_ort $PY -X faulthandler -c "import torch; import llama_cpp; $ORT"
echo "=== static libstdc++ in the ggml libraries?" >> "$LOG"
readelf -Ws --wide "$site"/lib/libggml-base.so | grep -c '_ZNSt\|_ZSt' >> "$LOG"
readelf -Ws --wide "$site"/lib/libllama.so | grep 'once_proxy\|__once_call' >> "$LOG"
env | grep -i 'flags\|^cc=\|^cxx=\|ld_' >> "$LOG"; g++ --version | head -1 >> "$LOG"
echo "=== cuda-gdb bt with symbols of libc" >> "$LOG"
timeout 100 cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt 6 -ex "info symbol *(long*)\$sp" \
  --args $PY -c "import llama_cpp; import onnxruntime" 2>&1 | grep '^#\|in section' | head -8 >> "$LOG"
echo done | tee -a "$LOG"
