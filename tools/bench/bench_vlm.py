# SPDX-License-Identifier: Apache-2.0
"""VLM benchmark (issue 15): mixed (F16 mmproj + Q4_K_M decoder) vs all-F16 vs all-4-bit, same run.

Model: a LLaVA-style model built from ``transformers`` configs with RANDOM weights (no VLM weights are
installable offline): SigLIP vision tower (224 px, 14 px patches -> 256 image tokens) + LLaVA-1.5 MLP
projector + llama decoder, saved with its processor and a byte-level BPE tokenizer (as
tests/vlm_fixtures.py, larger). The text it writes is meaningless; token equality is the parity check.

Bundles: ``edgesdk build --profile cpu-x86_64 --quant-type Q4_K_M`` (mixed) and ``--quant-type F16``
(all-F16), each the real build (conversion, quantization, parity vs PyTorch, license gate, package).
all-4-bit = the mixed bundle with its mmproj rewritten here (bench-local, no product change): gguf-py's
``GGUFReader`` reads the F16 mmproj, every 2-D ``*.weight`` matrix (attention, MLP, projector) is
quantized with ``gguf.quants.quantize`` (``--mmproj-quant``, default Q4_0); norms, biases, the
position embedding and the conv patch embedding keep their F32/F16 type. Loaded with verify=False
(its hashes no longer match the manifest's).

Measured per configuration, all sessions loaded in one process and timed in interleaved rounds
(order rotated each round), greedy (temperature 0), fixed ``--max-tokens``:
  * question 1 cold (features and KV cleared): end-to-end wall of ``generate`` and the stage times of
    ``session.report()["backend_report"]["last_request"]`` (preprocess, encode, prefill, decode per token,
    TTFT);
  * questions 2..n about the same image (features cached, KV prefix reused): TTFT; and question 2 again
    cold (TTFT without reuse, same question);
  * load, in a fresh child process per load: ``edgesdk.load`` with ``use_mmap`` on (llama.cpp's
    default) and off: load time, VmHWM (peak RSS) after load and after one question, VmHWM of the
    imports alone;
  * parity on 3 generated images: image features (encoder + projector, what the decoder receives) vs
    PyTorch ``get_image_features`` (min cosine per image token) and vs the all-F16 build; first greedy
    tokens vs PyTorch's ``generate`` and vs the all-F16 build.
Ratios are against anchors measured in the same run: mixed / all-4-bit end-to-end latency (goal
<= 1.05), mixed encoder cosine vs all-F16's, TTFT question 1 / questions 2..n (goal >= 5x).

Usage: python tools/bench/bench_vlm.py [--size small|medium|large] [--threads 2] [--n-gpu-layers 0] [--profile P]
       [--rounds 5] [--max-tokens 16] [--mmproj-quant Q4_0] [--out tools/bench/results/vlm_cpu.json]
With a CUDA build of llama-cpp-python, ``--n-gpu-layers 99`` offloads the decoder and runs the encoder on
the GPU (libmtmd ``use_gpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import _cpu_model as _measure_cpu_model  # noqa: E402

import edgesdk  # noqa: E402  before numpy: preloads a CUDA libllama first (see edgesdk/__init__.py)

SIZES = {  # SigLIP tower + llama decoder; every matrix width a multiple of 256 (K-quants) and 32 (Q4_0)
    "small": {
        "image": 224,
        "patch": 14,
        "v_hidden": 384,
        "v_inter": 1536,
        "v_layers": 4,
        "v_heads": 6,
        "t_hidden": 768,
        "t_inter": 2048,
        "t_layers": 6,
        "t_heads": 12,
        "t_kv": 4,
    },
    "medium": {
        "image": 224,
        "patch": 14,
        "v_hidden": 768,
        "v_inter": 3072,
        "v_layers": 12,
        "v_heads": 12,
        "t_hidden": 1024,
        "t_inter": 2816,
        "t_layers": 12,
        "t_heads": 16,
        "t_kv": 8,
    },
    # P9 on a GPU (issue 21): SigLIP-base-sized tower and a TinyLlama-1.1B-shaped decoder (~1.0 B parameters with
    # the fixture's small vocabulary)
    "large": {
        "image": 224,
        "patch": 14,
        "v_hidden": 768,
        "v_inter": 3072,
        "v_layers": 12,
        "v_heads": 12,
        "t_hidden": 2048,
        "t_inter": 5632,
        "t_layers": 22,
        "t_heads": 32,
        "t_kv": 4,
    },
}
QUESTIONS = [
    "What is on the table?",
    "What colour is the largest shape?",
    "How many objects are there?",
    "Is it day or night?",
    "Describe the background.",
]
PARITY_PROMPT = "Describe the image."
N_CTX = 1024
CONFIGS = ("mixed", "all_f16", "all_4bit")


# ------------------------------------------------------------------ the random-weight model (child process)


def make_model(directory: Path, size: str, seed: int = 0) -> None:
    """Save a random-weight LLaVA (SigLIP + llama) with processor, tokenizer and an Apache-2.0 model card."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    from edgesdk.formats.gguf.build import PPL_TEXT

    sz = SIZES[size]
    n_img = (sz["image"] // sz["patch"]) ** 2
    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        PPL_TEXT.read_text().split("\n"),
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["<|bos|>", "<|end|>", "<image>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>", extra_special_tokens={"image_token": "<image>"}
    )
    image_processor = SiglipImageProcessor(
        size={"height": sz["image"], "width": sz["image"]},
        resample=2,
        do_resize=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )
    LlavaProcessor(
        image_processor=image_processor,
        tokenizer=fast,
        patch_size=sz["patch"],
        vision_feature_select_strategy="full",
        image_token="<image>",
        num_additional_image_tokens=0,
    ).save_pretrained(directory)
    image_processor.save_pretrained(directory)  # preprocessor_config.json also with transformers 5 (which nests it)
    vision = SiglipVisionConfig(
        image_size=sz["image"],
        patch_size=sz["patch"],
        hidden_size=sz["v_hidden"],
        intermediate_size=sz["v_inter"],
        num_hidden_layers=sz["v_layers"],
        num_attention_heads=sz["v_heads"],
        hidden_act="gelu_pytorch_tanh",
        vision_use_head=False,
    )
    # initializer_range scaled so each matrix has the gain of tests/vlm_fixtures.py's (0.2 at width 64):
    # random logits with clear winners (greedy tokens a strict check, not flips on near-ties) without
    # saturating attention
    text = LlamaConfig(
        vocab_size=len(tok.get_vocab()),
        hidden_size=sz["t_hidden"],
        intermediate_size=sz["t_inter"],
        num_hidden_layers=sz["t_layers"],
        num_attention_heads=sz["t_heads"],
        num_key_value_heads=sz["t_kv"],
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        initializer_range=1.6 / sz["t_hidden"] ** 0.5,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=fast.convert_tokens_to_ids("<image>"),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="full",
        vision_feature_layer=-2,
        image_seq_length=n_img,
    )
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).eval().save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# bench-llava (random weights)\n\nA LLaVA-style model built from "
        "transformers configs with RANDOM weights for benchmarks: it describes nothing.\n",
        encoding="utf-8",
    )


def make_images(directory: Path) -> list[Path]:
    """Generated images: shapes (the timed one), gradient, checkerboard, noise (parity: the last three)."""
    import numpy as np
    from PIL import Image, ImageDraw

    directory.mkdir(parents=True, exist_ok=True)
    shapes = Image.new("RGB", (320, 240), (30, 60, 90))
    draw = ImageDraw.Draw(shapes)
    draw.ellipse((20, 30, 150, 160), fill=(240, 200, 20))
    draw.rectangle((180, 60, 300, 200), fill=(200, 30, 30))
    y, x = np.mgrid[0:200, 0:260]
    arrays = {
        "gradient.png": np.stack([x * 255 // 259, y * 255 // 199, (x + y) * 255 // 458], axis=-1),
        "checker.png": np.stack([((x // 20 + y // 20) % 2) * 255] * 3, axis=-1),
        "noise.png": np.random.default_rng(0).integers(0, 256, size=(180, 180, 3)),
    }
    out = [directory / "shapes.png"]
    shapes.save(out[0])
    for name, a in arrays.items():
        out.append(directory / name)
        Image.fromarray(a.astype(np.uint8)).save(out[-1])
    return out


# ------------------------------------------------------------------ the 4-bit mmproj (bench-local)


def quantize_mmproj(src: Path, dst: Path, qtype_name: str) -> dict:
    """Rewrite ``src`` with its 2-D weight matrices quantized to ``qtype_name``; everything else as it was."""
    import gguf
    import numpy as np

    qtype = gguf.GGMLQuantizationType[qtype_name]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "general.file_type":
            value = int(getattr(gguf.LlamaFileType, f"MOSTLY_{qtype_name}"))
        writer.add_key_value(key, value, vtype, sub_type=sub)
    quantized, kept = [], []
    for t in reader.tensors:
        data = np.asarray(t.data)
        if (
            len(t.shape) == 2
            and t.name.endswith(".weight")
            and "position" not in t.name
            and t.tensor_type in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32)
            and int(t.shape[0]) % block == 0
        ):
            writer.add_tensor(t.name, gguf.quants.quantize(data.astype(np.float32), qtype), raw_dtype=qtype)
            quantized.append(t.name)
        else:
            writer.add_tensor(t.name, data, raw_dtype=t.tensor_type)
            kept.append(f"{t.name} {t.tensor_type.name}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {
        "type": qtype_name,
        "quantized_tensors": len(quantized),
        "kept": kept,
        "bytes_f16": src.stat().st_size,
        "bytes": dst.stat().st_size,
    }


# ------------------------------------------------------------------ load in a fresh child process

_LOAD_CHILD = r"""
import json, sys, time
def mem():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM:", "VmRSS:")):
                k, v = line.split(":")
                d[k] = round(int(v.split()[0]) / 1024, 1)
    return d
spec = json.loads(sys.argv[1])
import edgesdk  # before numpy (CUDA builds)
import llama_cpp  # noqa: F401
imports = mem()
t0 = time.perf_counter()
s = edgesdk.load(spec["bundle"], verify=False, threads=spec["threads"], n_gpu_layers=spec["ngl"], n_ctx=spec["n_ctx"],
                 use_mmap=spec["mmap"])
load_s = time.perf_counter() - t0
loaded = mem()
s.generate(spec["question"], images=[spec["image"]], max_tokens=spec["max_tokens"], temperature=0)
asked = mem()
rep = s.report()["backend_report"]
s.close()
print("RESULT " + json.dumps({"load_s": round(load_s, 4), "imports_hwm_mib": imports["VmHWM"],
      "after_load_hwm_mib": loaded["VmHWM"], "after_load_rss_mib": loaded["VmRSS"],
      "after_question_hwm_mib": asked["VmHWM"], "backend_load_s": rep.get("load_s"), "mmap": rep.get("mmap"),
      "n_gpu_layers": rep.get("n_gpu_layers")}))
"""


def measure_load(bundle: Path, mmap: bool, args, image: Path) -> dict:
    spec = {
        "bundle": str(bundle),
        "threads": args.threads,
        "ngl": args.n_gpu_layers,
        "n_ctx": N_CTX,
        "mmap": mmap,
        "question": QUESTIONS[0],
        "image": str(image),
        "max_tokens": 4,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD_CHILD, json.dumps(spec)], capture_output=True, text=True, timeout=600, cwd=REPO
    )  # cwd: this checkout's edgesdk, not an installed one
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or [f"exit {proc.returncode}"]
        return {"error": tail[0][:300]}
    got = json.loads(line[len("RESULT ") :])
    if not mmap and "use_mmap=False" not in str(got.get("mmap")):
        return {
            "error": "this edgesdk ignores the use_mmap load option (needs edgesdk/runtime/backends/vlm/ "
            "with use_mmap)",
            **got,
        }
    return got


# ------------------------------------------------------------------ timing


def reset(session) -> None:
    """Forget cached image features, preprocessed frames and the KV prefix (the next request is cold)."""
    session.backend.forget()


def ask(session, question: str, image: Path, max_tokens: int) -> dict:
    t0 = time.perf_counter()
    session.generate(question, images=[image], max_tokens=max_tokens, temperature=0)
    wall = time.perf_counter() - t0
    last = session.report()["backend_report"]["last_request"]
    st = last["stages_s"]
    sampled = last["output_tokens"] + (1 if last["finish_reason"] == "stop" else 0)
    return {
        "e2e_s": wall,
        "ttft_s": last["ttft_s"],
        "preprocess_s": st.get("preprocess_s"),
        "encode_s": st.get("encode_s"),
        "prefill_s": st.get("prefill_s"),
        "decode_s": st.get("decode_s"),
        "decode_per_token_s": st["decode_s"] / (sampled - 1) if sampled > 1 else None,
        "output_tokens": last["output_tokens"],
        "input_tokens": last["input_tokens"],
        "image_tokens": last["image_tokens"],
        "images_cached": last["images_cached"],
        "kv_reused_tokens": last["kv_reused_tokens"],
    }


def med(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 3)


# ------------------------------------------------------------------ parity


def cosine_rows(a, b):
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.clip(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30, None)


def parity(sessions: dict, refs: list[dict], images: list[Path], n_tokens: int) -> dict:
    out: dict = {}
    f16_feats, f16_tokens, mixed_tokens = [], [], []
    for name in [n for n in ("all_f16", "mixed", "all_4bit") if n in sessions]:
        s = sessions[name]
        reset(s)
        per_image = []
        for i, (path, ref) in enumerate(zip(images, refs, strict=True)):
            feats = s.backend.image_features(path)
            s.generate(PARITY_PROMPT, images=[path], max_tokens=n_tokens, temperature=0)
            toks = list(s.report()["backend_report"]["last_request"]["output_ids"])
            row = {
                "image": path.name,
                "min_cosine_vs_pytorch": round(float(cosine_rows(feats, ref["features"]).min()), 6),
                "tokens": toks,
                "tokens_equal_pytorch": toks == ref["tokens"],
            }
            if name == "all_f16":
                f16_feats.append(feats)
                f16_tokens.append(toks)
            else:
                if name == "mixed":
                    mixed_tokens.append(toks)
                elif mixed_tokens:  # same decoder as mixed: only the mmproj differs
                    row["tokens_equal_mixed"] = toks == mixed_tokens[i]
                row["min_cosine_vs_all_f16"] = round(float(cosine_rows(feats, f16_feats[i]).min()), 6)
                row["tokens_equal_all_f16"] = toks == f16_tokens[i]
            per_image.append(row)
        out[name] = {
            "encoder_min_cosine_vs_pytorch": min(r["min_cosine_vs_pytorch"] for r in per_image),
            "greedy_equal_pytorch": f"{sum(r['tokens_equal_pytorch'] for r in per_image)}/{len(per_image)}",
            "per_image": per_image,
        }
        if name != "all_f16":
            out[name]["encoder_min_cosine_vs_all_f16"] = min(r["min_cosine_vs_all_f16"] for r in per_image)
            out[name]["greedy_equal_all_f16"] = f"{sum(r['tokens_equal_all_f16'] for r in per_image)}/{len(per_image)}"
        if name == "all_4bit" and mixed_tokens:
            out[name]["greedy_equal_mixed"] = f"{sum(r['tokens_equal_mixed'] for r in per_image)}/{len(per_image)}"
        reset(s)
    out["pytorch_tokens"] = [r["tokens"] for r in refs]
    return out


# ------------------------------------------------------------------ main


def build_bundle(model: Path, out: Path, quant: str, reuse: bool, profile: str = "cpu-x86_64") -> dict:
    if reuse and (out / "manifest.json").is_file():
        return {"wall_s": None, "reused": str(out)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgesdk",
            "build",
            str(model),
            "--profile",
            profile,
            "--quant-type",
            quant,
            "-o",
            str(out),
            "--no-progress",
            "--force",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if proc.returncode != 0:
        sys.exit(f"edgesdk build --quant-type {quant} failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}")
    return {"wall_s": round(time.perf_counter() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--profile", default="cpu-x86_64", help="profile to build for (h200 on the GPU)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--parity-tokens", type=int, default=8)
    ap.add_argument("--mmproj-quant", default="Q4_0", choices=["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
    ap.add_argument("--work", help="keep the model and bundles in this directory (default: a temp dir, removed)")
    ap.add_argument("--reuse", action="store_true", help="with --work: keep bundles already built there")
    ap.add_argument("--out", default=str(REPO / "tools/bench/results/vlm_cpu.json"))
    ap.add_argument("--make-model", help=argparse.SUPPRESS)  # child: write the random model to this directory
    args = ap.parse_args()
    if args.make_model:
        make_model(Path(args.make_model), args.size)
        return 0

    import llama_cpp

    from edgesdk.formats.vlm.build import hf_vlm_reference

    t_start = time.perf_counter()
    load_start = os.getloadavg()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-vlm-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = work / f"llava-{args.size}"
    t0 = time.perf_counter()
    if not (model / "config.json").is_file():
        subprocess.run(
            [sys.executable, __file__, "--size", args.size, "--make-model", str(model)],
            check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    make_s = time.perf_counter() - t0
    images = make_images(work / "images")
    timed_image, parity_images = images[0], images[1:]

    bundles = {"mixed": work / "b-mixed", "all_f16": work / "b-f16", "all_4bit": work / "b-4bit"}
    builds = {
        "mixed": build_bundle(model, bundles["mixed"], "Q4_K_M", args.reuse, args.profile),
        "all_f16": build_bundle(model, bundles["all_f16"], "F16", args.reuse, args.profile),
    }
    shutil.rmtree(bundles["all_4bit"], ignore_errors=True)
    shutil.copytree(bundles["mixed"], bundles["all_4bit"])
    (bundles["all_4bit"] / "mmproj.gguf").unlink()
    mmq = quantize_mmproj(bundles["mixed"] / "mmproj.gguf", bundles["all_4bit"] / "mmproj.gguf", args.mmproj_quant)
    manifests = {
        k: json.loads((bundles[k if k != "all_4bit" else "mixed"] / "manifest.json").read_text()) for k in bundles
    }
    components = {
        k: {
            "decoder": manifests[k]["extras"]["vlm"]["components"]["decoder"]["precision"],
            "mmproj": mmq["type"] if k == "all_4bit" else "F16",
            "decoder_bytes": (bundles[k] / "model.gguf").stat().st_size,
            "mmproj_bytes": (bundles[k] / "mmproj.gguf").stat().st_size,
        }
        for k in bundles
    }

    # the 4-bit mmproj must load: if llama.cpp refuses it, say so and go on with the two others
    configs = list(CONFIGS)
    sessions, load_errors = {}, {}
    for name in CONFIGS:
        try:
            sessions[name] = edgesdk.load(
                bundles[name],
                verify=name != "all_4bit",
                threads=args.threads,
                n_gpu_layers=args.n_gpu_layers,
                n_ctx=N_CTX,
            )
        except Exception as exc:  # noqa: BLE001 - reported in the results
            load_errors[name] = f"{type(exc).__name__}: {exc}"[:400]
            configs.remove(name)
            print(f"{name}: llama.cpp did not load it: {load_errors[name]}")
    backend_reports = {
        k: {x: v for x, v in s.report()["backend_report"].items() if x != "last_request"} for k, s in sessions.items()
    }

    # timing: warm-up (first request allocates graphs), then interleaved rounds
    for name in configs:
        reset(sessions[name])
        ask(sessions[name], QUESTIONS[0], timed_image, args.max_tokens)
    q1: dict = {k: [] for k in configs}
    qn: dict = {k: [] for k in configs}
    q2_cold: dict = {k: [] for k in configs}
    for r in range(args.rounds):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for name in order:
            s = sessions[name]
            reset(s)
            q1[name].append(ask(s, QUESTIONS[0], timed_image, args.max_tokens))
            for q in QUESTIONS[1:]:
                qn[name].append(ask(s, q, timed_image, args.max_tokens))
            reset(s)
            q2_cold[name].append(ask(s, QUESTIONS[1], timed_image, args.max_tokens))
    summary: dict = {}
    for name in configs:
        keys = ("e2e_s", "ttft_s", "preprocess_s", "encode_s", "prefill_s", "decode_per_token_s")
        summary[name] = {f"q1_{k[:-2]}_ms": ms(med([x[k] for x in q1[name]])) for k in keys}
        summary[name].update(
            {
                "q1_output_tokens": sorted({x["output_tokens"] for x in q1[name]}),
                "q1_input_tokens": q1[name][0]["input_tokens"],
                "image_tokens": q1[name][0]["image_tokens"],
                "q2n_ttft_ms": ms(med([x["ttft_s"] for x in qn[name]])),
                "q2n_encode_ms": ms(med([x["encode_s"] for x in qn[name]])),
                "q2n_prefill_ms": ms(med([x["prefill_s"] for x in qn[name]])),
                "q2n_images_cached": min(x["images_cached"] for x in qn[name]),
                "q2n_kv_reused_tokens_min": min(x["kv_reused_tokens"] for x in qn[name]),
                "q2_cold_ttft_ms": ms(med([x["ttft_s"] for x in q2_cold[name]])),
            }
        )
        sm = summary[name]
        sm["ttft_reuse_ratio_q1_over_q2n"] = round(sm["q1_ttft_ms"] / sm["q2n_ttft_ms"], 2)
        sm["ttft_reuse_ratio_q2_cold_over_q2n"] = round(sm["q2_cold_ttft_ms"] / sm["q2n_ttft_ms"], 2)

    # parity: PyTorch reference in a child process (the product's own helper), then each configuration
    refs = hf_vlm_reference(model, parity_images, "USER: <image>\n" + PARITY_PROMPT + " ASSISTANT:", args.parity_tokens)
    par = parity(sessions, refs, parity_images, args.parity_tokens) if "all_f16" in sessions else {}
    for s in sessions.values():
        s.close()

    # load: fresh child process per load, use_mmap on and off
    loads = {
        name: {
            ("mmap" if mm else "no_mmap"): measure_load(bundles[name], mm, args, timed_image) for mm in (True, False)
        }
        for name in configs
    }

    ratios: dict = {}
    if "mixed" in summary and "all_4bit" in summary:
        ratios["mixed_over_all_4bit_e2e"] = round(summary["mixed"]["q1_e2e_ms"] / summary["all_4bit"]["q1_e2e_ms"], 4)
        ratios["mixed_over_all_4bit_e2e_per_round"] = [
            round(a["e2e_s"] / b["e2e_s"], 4) for a, b in zip(q1["mixed"], q1["all_4bit"], strict=True)
        ]
        ratios["goal_mixed_within_5pct_of_all_4bit"] = ratios["mixed_over_all_4bit_e2e"] <= 1.05
    if "mixed" in summary and "all_f16" in summary:
        ratios["mixed_over_all_f16_e2e"] = round(summary["mixed"]["q1_e2e_ms"] / summary["all_f16"]["q1_e2e_ms"], 4)
    if par and "mixed" in par:
        ratios["encoder_cosine_mixed_vs_pytorch"] = par["mixed"]["encoder_min_cosine_vs_pytorch"]
        ratios["encoder_cosine_all_f16_vs_pytorch"] = par["all_f16"]["encoder_min_cosine_vs_pytorch"]
        ratios["goal_mixed_at_all_f16_encoder_parity"] = (
            par["mixed"]["encoder_min_cosine_vs_pytorch"] >= par["all_f16"]["encoder_min_cosine_vs_pytorch"] - 1e-6
        )
    if "all_4bit" in par:
        ratios["encoder_cosine_all_4bit_vs_pytorch"] = par["all_4bit"]["encoder_min_cosine_vs_pytorch"]
    if "mixed" in summary:
        ratios["ttft_reuse_mixed_q1_over_q2n"] = summary["mixed"]["ttft_reuse_ratio_q1_over_q2n"]
        ratios["goal_reuse_ge_5x"] = ratios["ttft_reuse_mixed_q1_over_q2n"] >= 5.0

    import gguf

    result = {
        "benchmark": "VLM (issue 15): mixed (F16 mmproj + Q4_K_M decoder) vs all-F16 vs all-4-bit, same run",
        "goals": {"mixed_over_all_4bit_e2e": "<= 1.05", "mixed_encoder_parity": "= all-F16's", "ttft_reuse": ">= 5x"},
        "method": __doc__,
        "model": {
            "size": args.size,
            **SIZES[args.size],
            "weights": "RANDOM (transformers configs)",
            "make_s": round(make_s, 2),
        },
        "settings": {
            "profile": args.profile,
            "threads": args.threads,
            "n_gpu_layers": args.n_gpu_layers,
            "n_ctx": N_CTX,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "greedy": True,
            "questions": QUESTIONS,
            "timed_image": timed_image.name,
            "parity_images": [p.name for p in parity_images],
            "parity_tokens": args.parity_tokens,
        },
        "builds": builds,
        "build_parity": {k: manifests[k]["parity"] for k in ("mixed", "all_f16")},
        "components": components,
        "mmproj_quantization": mmq,
        "load_errors": load_errors,
        "backend_reports": backend_reports,
        "summary": summary,
        "ratios": ratios,
        "parity": par,
        "load": loads,
        "raw": {"q1": q1, "q2n": qn, "q2_cold": q2_cold},
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu_model": _cpu_model(),
            "loadavg_at_start": load_start,
            "loadavg_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
            "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
            "transformers": _dist_version("transformers"),
            "gpu": _gpu(),
        },
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print_table(result)
    print(f"-> {args.out} ({result['wall_s']} s)")
    return 0


def print_table(r: dict) -> None:
    s = r["summary"]
    cols = (
        "q1_e2e_ms",
        "q1_preprocess_ms",
        "q1_encode_ms",
        "q1_prefill_ms",
        "q1_decode_per_token_ms",
        "q1_ttft_ms",
        "q2n_ttft_ms",
        "q2_cold_ttft_ms",
        "ttft_reuse_ratio_q1_over_q2n",
    )
    print(
        "config    "
        + " ".join(
            f"{c:>14}"
            for c in (
                "e2e",
                "preproc",
                "encode",
                "prefill",
                "dec/tok",
                "ttft q1",
                "ttft q2..n",
                "ttft q2 cold",
                "q1/q2..n",
            )
        )
    )
    for name, row in s.items():
        print(f"{name:<10}" + " ".join(f"{row[c]:>14}" for c in cols))
    for name, lo in r["load"].items():
        for mode, v in lo.items():
            print(f"load {name:<9} {mode:<8} {v}")
    for name in ("all_f16", "mixed", "all_4bit"):
        p = r["parity"].get(name)
        if p:
            print(
                f"parity {name:<9} encoder min cos vs PyTorch {p['encoder_min_cosine_vs_pytorch']}, greedy = PyTorch "
                f"{p['greedy_equal_pytorch']}"
                + (
                    f", = all-F16 {p['greedy_equal_all_f16']}, encoder cos vs all-F16 "
                    f"{p['encoder_min_cosine_vs_all_f16']}"
                    if name != "all_f16"
                    else ""
                )
                + (f", = mixed {p['greedy_equal_mixed']}" if "greedy_equal_mixed" in p else "")
            )
    if r["load_errors"]:
        print("NOT LOADED:", r["load_errors"])
    print("ratios", json.dumps(r["ratios"]))


def _cpu_model() -> str:
    return _measure_cpu_model() or platform.processor()


def _gpu() -> str | None:
    """nvidia-smi's GPU name and driver, where there is one (never imports torch: see edgesdk/__init__.py)."""
    if not shutil.which("nvidia-smi"):
        return None
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
    )
    return proc.stdout.strip() or None


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
