# SPDX-License-Identifier: Apache-2.0
"""P4: on the H200, do the planner's llama.cpp settings reach >= 0.98x of the best hand-tuned ones?

Run on the GPU machine (tools/device/run_p4.sh builds llama-cpp-python with CUDA first):
    python tools/bench/bench_p4_h200.py --out tools/bench/results/p4_h200.json

What it does, all in one process and one run:
1. makes a random-weight TinyLlama-1.1B-shaped llama with transformers (22 layers, hidden 2048,
   32 heads / 4 KV heads, ffn 5632, vocab 32000) and a small BPE tokenizer trained on
   edgesdk/data/ppl_text.txt (vocab padded to 32000 by the converter);
2. converts it with edgesdk's converter (F16) and quantizes it with llama.cpp (Q4_K_M);
3. plans both for the `h200` profile (edgesdk.plan.plan_build) and loads each through the real
   runtime (edgesdk.load on a bundle directory) with the planner's settings, then with hand-tuned
   settings: flash attention on/off x all layers / half the layers offloaded;
4. per setting: prefill tok/s of a 512-token prompt (best of 3 evals) and decode tok/s over 128
   greedy tokens (best of 3), batch 1. Anchor = the best hand-tuned figure of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TINYLLAMA = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5)
# --shape tiny: a seconds-long dry run of the whole script on a CPU host (figures meaningless there)
TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1024, max_position_embeddings=1024, rms_norm_eps=1e-5)


def make_model(directory: Path, shape: dict) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    text = (REPO / "edgesdk" / "data" / "ppl_text.txt").read_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text.split("\n"), trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)
    cfg = LlamaConfig(**shape, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.float16)
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text("---\nlicense: apache-2.0\n---\nrandom weights (benchmark only)\n")


def make_bundle(gguf: Path, bundle_dir: Path, plan, info: dict) -> Path:
    from edgesdk import bundle as B
    from edgesdk.formats.gguf.facts import gguf_facts

    bundle_dir.mkdir(parents=True, exist_ok=True)
    target = bundle_dir / "model.gguf"
    if not target.exists():
        os.link(gguf, target)
    facts = gguf_facts(target)
    manifest = {"schema": B.SCHEMA, "bundle_id": f"p4-{facts['file_type']}", "format": "gguf",
                "precision": facts["file_type"], "model": {"name": "tinyllama-1.1b-shaped-random"},
                "profile": {"name": "h200"}, "plan": plan.to_dict(),
                "artifacts": [{"path": "model.gguf", "role": "model", "sha256": "not-computed",
                               "bytes": target.stat().st_size}],
                "extras": {"llm": {**info, "layers": facts["layers"], "kv_heads": facts["kv_heads"],
                                   "head_dim": facts["head_dim"], "file_bytes": target.stat().st_size,
                                   "quant_type": facts["file_type"]}}}
    B.write_manifest(bundle_dir, manifest)
    return bundle_dir


def measure(bundle_dir: Path, overrides: dict, n_prefill: int, n_decode: int, reps: int) -> dict:
    import edgesdk

    t0 = time.perf_counter()
    session = edgesdk.load(bundle_dir, profile="h200", verify=False, **overrides)
    load_s = time.perf_counter() - t0
    backend = session.backend
    llm = backend._llm
    prompt = [(i * 7919) % 900 + 50 for i in range(n_prefill)]
    prefill = []
    for _ in range(reps + 1):  # first round warms up kernels / CUDA graphs
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        prefill.append(n_prefill / (time.perf_counter() - t))
    decode = []
    for _ in range(reps + 1):
        n, t_first = 0, None
        for _tok in llm.generate(prompt[:16], temp=0.0, top_k=1):
            n += 1
            if n == 1:
                t_first = time.perf_counter()
            if n > n_decode:
                break
        decode.append(n_decode / (time.perf_counter() - t_first))
    report = session.report()
    text = session.generate("The harbour town", max_tokens=16, temperature=0)  # the real runtime path once
    session.close()
    return {"overrides": overrides, "load_s": round(load_s, 2), "prefill_tok_s": round(max(prefill[1:]), 1),
            "decode_tok_s": round(max(decode[1:]), 1), "prefill_all": [round(x, 1) for x in prefill],
            "decode_all": [round(x, 1) for x in decode], "settings": report["backend_report"],
            "fallbacks": report["fallbacks"], "generated_chars": len(text)}


def _child(args: list[str], timeout: float = 400) -> dict:
    """Run one stage of this script in a child process and return its last JSON line.

    Why children: a crash in one configuration must cost that configuration only (recorded with its
    signal), not the whole run. (The "free(): invalid pointer" aborts once seen with torch and llama.cpp
    in one process came from a llama.cpp build with a second C++ runtime: docs/native-libraries.md.)"""
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-3:]
        return {"error": f"exit {proc.returncode}", "stderr_tail": tail}
    return json.loads(lines[-1])


def stage_prepare(work: Path, shape_name: str) -> dict:
    from edgesdk.formats.gguf import convert as conv

    times = {}
    hf = work / "tinyllama-shaped"
    t = time.perf_counter()
    hf.mkdir(parents=True, exist_ok=True)
    make_model(hf, TINYLLAMA if shape_name == "tinyllama" else TINY)
    times["make_hf_model_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    conv.convert_hf_to_gguf(hf, work / "model-f16.gguf", name="tinyllama-1.1b-shaped-random")
    times["convert_f16_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    conv.quantize(work / "model-f16.gguf", work / "model-q4_k_m.gguf", "Q4_K_M", threads=os.cpu_count())
    times["quantize_q4_k_m_s"] = round(time.perf_counter() - t, 1)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", choices=("all", "prepare", "measure"), default="all")
    ap.add_argument("--bundle", default=None)
    ap.add_argument("--overrides", default="{}")
    ap.add_argument("--out", default=str(REPO / "tools/bench/results/p4_h200.json"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shape", choices=("tinyllama", "tiny"), default="tinyllama")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="p4-"))
    if args.stage == "prepare":
        print(json.dumps(stage_prepare(work, args.shape)))
        return 0
    if args.stage == "measure":
        print(json.dumps(measure(Path(args.bundle), json.loads(args.overrides), args.prefill, args.decode,
                                 args.reps)))
        return 0
    from edgesdk.plan import BuildOptions, inspect_model, plan_build
    from edgesdk.profiles import resolve_profile

    shape = TINYLLAMA if args.shape == "tinyllama" else TINY
    hf, f16, q4 = work / "tinyllama-shaped", work / "model-f16.gguf", work / "model-q4_k_m.gguf"
    times = _child(["--stage", "prepare", "--work", str(work), "--shape", args.shape], timeout=900)
    if "error" in times:
        print("prepare failed:", times, flush=True)
        return 1
    profile = resolve_profile("h200")
    facts = inspect_model(hf)
    results = {}
    for label, path, quant in (("F16", f16, None), ("Q4_K_M", q4, "Q4_K_M")):
        plan = plan_build(facts, profile, BuildOptions(quant_type=quant))
        info = {"n_ctx": plan.decision("gguf.context_length"), "n_gpu_layers": plan.decision("gguf.n_gpu_layers"),
                "flash_attn": plan.decision("gguf.flash_attn"), "threads": plan.decision("gguf.threads")}
        bundle = make_bundle(path, work / f"bundle-{label}", plan, info)
        layers = facts.extra["layers"]
        configs = {"planner": {},
                   "fa_on_all": {"flash_attn": True, "n_gpu_layers": layers + 1},
                   "fa_off_all": {"flash_attn": False, "n_gpu_layers": layers + 1},
                   "fa_on_half": {"flash_attn": True, "n_gpu_layers": layers // 2},
                   "fa_off_half": {"flash_attn": False, "n_gpu_layers": layers // 2}}
        common = ["--stage", "measure", "--bundle", str(bundle), "--prefill", str(args.prefill),
                  "--decode", str(args.decode), "--reps", str(args.reps)]
        runs = {name: {"overrides": ov, **_child([*common, "--overrides", json.dumps(ov)])}
                for name, ov in configs.items()}
        for name, r in runs.items():
            if "error" in r:
                print(f"  {name}: {r}", flush=True)
        ok = {k: v for k, v in runs.items() if "error" not in v}
        if "planner" not in ok or len(ok) < 2:
            results[label] = {"planned": info, "runs": runs, "error": "planner run or all hand-tuned runs failed"}
            continue
        runs = ok
        hand = {k: v for k, v in runs.items() if k != "planner"}
        best_dec = max(hand.values(), key=lambda r: r["decode_tok_s"])
        best_pre = max(hand.values(), key=lambda r: r["prefill_tok_s"])
        results[label] = {
            "planner_decisions": {d.key: d.value for d in plan.decisions if d.key.startswith("gguf.")},
            "planned": info, "runs": runs,
            "p4_decode_ratio": round(runs["planner"]["decode_tok_s"] / best_dec["decode_tok_s"], 4),
            "p4_prefill_ratio": round(runs["planner"]["prefill_tok_s"] / best_pre["prefill_tok_s"], 4),
            "best_hand_tuned_decode": [k for k, v in hand.items() if v is best_dec][0],
            "best_hand_tuned_prefill": [k for k, v in hand.items() if v is best_pre][0]}
        print(label, json.dumps({k: v for k, v in results[label].items() if k != "runs"}), flush=True)
        for name, r in runs.items():
            print(f"  {name:12s} prefill {r['prefill_tok_s']:>9.1f} tok/s  decode {r['decode_tok_s']:>7.1f} tok/s  "
                  f"({r['settings']['placement']}, FA {r['settings']['flash_attn']})", flush=True)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        smi = "no nvidia-smi (not a GPU host)"
    import llama_cpp

    out = {"benchmark": "P4 (GGUF on H200): planner settings vs best hand-tuned, same run",
           "goal": "planner >= 0.98x best hand-tuned decode and prefill tok/s",
           "method": __doc__, "machine": {"gpu": smi, "cpu_count": os.cpu_count(), "python": platform.python_version(),
                                          "llama_cpp_python": llama_cpp.__version__,
                                          "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode()},
           "model": {"shape": shape, "weights": "random (torch.manual_seed(0)), transformers LlamaForCausalLM",
                     "params": facts.params},
           "prep_times": times, "results": results,
           "anchor_facts_md": "docs/devices.md: decode 724 / 810 tok/s (F16 / Q4_K_M) FA on, 593 / 638 off; prefill "
                              "6.7k / 17.8k FA on, 0.37k / 2.8k off (same model shape, earlier session)"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
