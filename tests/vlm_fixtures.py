# SPDX-License-Identifier: Apache-2.0
"""A tiny LLaVA-style vision-language model with RANDOM weights, and a generated test image set.

No real VLM weights are installable offline, so the model is built from ``transformers`` configs:
``LlavaConfig`` = ``SiglipVisionConfig`` (or ``CLIPVisionConfig``; 64x64 images, 16x16 patches ->
16 image tokens, 2 layers, hidden 64) + ``LlamaConfig`` (2 layers, hidden 64) + the LLaVA-1.5 two-layer MLP
projector. The architecture and the whole export path are real; the numbers are random, so the model describes
nothing. It is saved as a Hugging Face directory with its processor (its image processor +
a byte-level BPE tokenizer trained here on the built-in text, with an ``<image>`` token) and a
model card declaring Apache-2.0 and saying the weights are random.

The text model's ``initializer_range`` is raised to 0.2 (transformers' default is 0.02) so the
random logits have clear winners: greedy decoding then picks the same tokens in PyTorch (FP32)
and in llama.cpp (F16) instead of flipping on near-ties, which makes token equality a strict test.
"""

from __future__ import annotations

from pathlib import Path

IMAGE_SIZE = 64
PATCH_SIZE = 16
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}USER: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n{% endif %}{% endfor %}"
    "{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %} {% else %}ASSISTANT: {{ m['content'] if m['content'] is string else "
    "m['content'][0]['text'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def byte_bpe(corpus: list[str], vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE tokenizer trained on ``corpus`` with ``special_tokens`` (the fixtures' tokenizers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return tok


def make_tiny_llava(directory: Path, *, vision: str = "siglip", seed: int = 0) -> Path:
    """Save the random-weight tiny LLaVA (weights, config, processor, tokenizer, model card) in ``directory``.

    ``vision``: ``siglip`` (SigLIP tower, all patch features: what llama.cpp's LLaVA graph reproduces) or
    ``clip`` (CLIP tower with a class token, LLaVA-1.5's ``default`` feature selection)."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
        SiglipImageProcessor,
        SiglipVisionConfig,
    )

    from edgesdk.formats.gguf.build import PPL_TEXT

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = byte_bpe(PPL_TEXT.read_text().split("\n"), 400, ["<|bos|>", "<|end|>", "<image>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>", extra_special_tokens={"image_token": "<image>"}
    )
    clip = vision == "clip"
    image_processor = (
        SiglipImageProcessor(
            size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            resample=2,
            do_resize=True,
            do_rescale=True,
            rescale_factor=1 / 255,
            do_normalize=True,
            image_mean=[0.5, 0.5, 0.5],
            image_std=[0.5, 0.5, 0.5],
            do_convert_rgb=True,
        )
        if not clip
        else CLIPImageProcessor(
            size={"shortest_edge": IMAGE_SIZE},
            crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            do_center_crop=True,
            do_resize=True,
            resample=3,
            do_rescale=True,
            rescale_factor=1 / 255,
            do_normalize=True,
            image_mean=[0.48145466, 0.4578275, 0.40821073],
            image_std=[0.26862954, 0.26130258, 0.27577711],
            do_convert_rgb=True,
        )
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=fast,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default" if clip else "full",
        image_token="<image>",
        num_additional_image_tokens=1 if clip else 0,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(directory)
    vcfg = dict(
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
    )
    vision_cfg = (
        CLIPVisionConfig(**vcfg, projection_dim=64, hidden_act="quick_gelu")
        if clip
        else SiglipVisionConfig(**vcfg, hidden_act="gelu_pytorch_tanh", vision_use_head=False)
    )
    text = LlamaConfig(
        vocab_size=len(tok.get_vocab()),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        initializer_range=0.2,
    )
    config = LlavaConfig(
        vision_config=vision_cfg,
        text_config=text,
        image_token_index=fast.convert_tokens_to_ids("<image>"),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default" if clip else "full",
        vision_feature_layer=-2,
        image_seq_length=IMAGE_TOKENS,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# tiny-llava (random weights)\n\nA LLaVA-style model built from "
        "transformers configs with RANDOM weights for tests: it describes nothing.\n",
        encoding="utf-8",
    )
    return directory


# ------------------------------------------------------------------ LLaVA-1.5 (CLIP ViT-L/14-336 tower, random weights)

# llava-hf/llava-1.5-7b-hf's published config.json / preprocessor_config.json values that the tiny model keeps:
# CLIP tower at 336 px with 14 px patches (576 image tokens + the class token), quick_gelu, layer-norm eps 1e-5,
# pre-layernorm, feature layer -2, ``default`` selection (the class token dropped), GELU two-layer projector;
# llama decoder with rms_norm_eps 1e-5, rope_theta 10000, max_position_embeddings 4096, no GQA; OpenAI CLIP
# mean/std, bicubic shortest-edge resize to 336 + 336 center crop. Shrunk: the tower 3 layers of width 128
# (2 heads of 64, as ViT-L's head width; FFN 4x), the decoder 2 layers of width 128 (4 heads, FFN 344).
LLAVA15_IMAGE_SIZE = 336
LLAVA15_PATCH_SIZE = 14
LLAVA15_IMAGE_TOKENS = (LLAVA15_IMAGE_SIZE // LLAVA15_PATCH_SIZE) ** 2  # 576
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def make_tiny_llava15(directory: Path, *, seed: int = 0) -> Path:
    """Save a random-weight LLaVA-1.5 (CLIP tower with a class token, ``vision_feature_select_strategy: default``,
    ``vision_feature_layer: -2``) built from the published llava-1.5 configuration, shrunk (above). RANDOM weights:
    it describes nothing. Saved by this host's transformers (4.57); :func:`to_transformers5_layout` gives the
    transformers 5 naming."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
    )

    from edgesdk.formats.gguf.build import PPL_TEXT

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = byte_bpe(
        PPL_TEXT.read_text().split("\n") + ["USER:", "ASSISTANT:"] * 10, 420, ["<|bos|>", "<|end|>", "<image>", "<pad>"]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|end|>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": LLAVA15_IMAGE_SIZE},
        crop_size={"height": LLAVA15_IMAGE_SIZE, "width": LLAVA15_IMAGE_SIZE},
        do_center_crop=True,
        do_resize=True,
        resample=3,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=CLIP_MEAN,
        image_std=CLIP_STD,
        do_convert_rgb=True,
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=fast,
        patch_size=LLAVA15_PATCH_SIZE,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(directory)
    vision = CLIPVisionConfig(
        image_size=LLAVA15_IMAGE_SIZE,
        patch_size=LLAVA15_PATCH_SIZE,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=2,
        projection_dim=768,
        hidden_act="quick_gelu",
        layer_norm_eps=1e-5,
    )
    text = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        initializer_range=0.2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=fast.convert_tokens_to_ids("<image>"),
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=LLAVA15_IMAGE_TOKENS,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# tiny-llava-1.5 (random weights)\n\nLLaVA-1.5's architecture "
        "(CLIP ViT-L/14-336 "
        "layout, shrunk) built from transformers configs with RANDOM weights for tests: it describes nothing.\n",
        encoding="utf-8",
    )
    return directory


def make_test_images(directory: Path) -> list[Path]:
    """A few synthetic images (Pillow): gradient, checkerboard, shapes, and a non-square photo-like one."""
    import numpy as np
    from PIL import Image, ImageDraw

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    y, x = np.mgrid[0:96, 0:96]
    grad = np.stack([x * 255 // 95, y * 255 // 95, (x + y) * 255 // 190], axis=-1).astype(np.uint8)
    out.append(directory / "gradient.png")
    Image.fromarray(grad).save(out[-1])
    checker = (((x // 12) + (y // 12)) % 2 * 255).astype(np.uint8)
    out.append(directory / "checker.png")
    Image.fromarray(np.stack([checker, 255 - checker, checker // 2], axis=-1)).save(out[-1])
    shapes = Image.new("RGB", (120, 80), (30, 60, 90))
    draw = ImageDraw.Draw(shapes)
    draw.ellipse((10, 10, 60, 60), fill=(240, 200, 20))
    draw.rectangle((70, 20, 110, 70), fill=(200, 30, 30))
    out.append(directory / "shapes.jpg")
    shapes.save(out[-1], quality=95)
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, size=(50, 70, 3), dtype=np.uint8)
    out.append(directory / "noise.png")
    Image.fromarray(noise).save(out[-1])
    return out


# ------------------------------------------------------------------ SmolVLM / Idefics3 (random weights)

IDEFICS3_IMAGE_SIZE = 64
IDEFICS3_PATCH_SIZE = 8
IDEFICS3_SCALE_FACTOR = 2
IDEFICS3_IMAGE_TOKENS = (IDEFICS3_IMAGE_SIZE // IDEFICS3_PATCH_SIZE) ** 2 // IDEFICS3_SCALE_FACTOR**2
# SmolVLM's chat format (its processor's DEFAULT_CHAT_TEMPLATE, without the video branch)
IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def make_tiny_idefics3(
    directory: Path, *, seed: int = 0, arch: str = "idefics3", image_splitting: bool = False
) -> Path:
    """Save a random-weight tiny SmolVLM-style ``Idefics3ForConditionalGeneration`` (the architecture of
    the SmolVLM checkpoints) in ``directory``: SigLIP-style vision tower (64 px, 8 px patches, 2 layers,
    hidden 64) + pixel-shuffle connector (scale factor 2 -> 16 image tokens, one bias-free linear) +
    llama decoder (2 layers, hidden 64). RANDOM weights: it describes nothing.

    The tokenizer (byte-level BPE trained here) carries the family's special tokens: ``<|im_start|>``
    (BOS), ``<end_of_utterance>`` (EOS), ``<fake_token_around_image>``, ``<image>``, ``<global-img>`` and
    ``<row_R_col_C>``; ``\\n`` and ``\\n\\n`` are single tokens, as llama.cpp's Idefics3 template looks
    them up. The processor does not split images (``do_image_splitting=False``): one image is one
    64x64 global image of 16 tokens, the layout the edgesdk runtime reproduces.

    ``image_splitting=True``: the processor of the real SmolVLM checkpoints (``do_image_splitting: true``,
    ``size.longest_edge`` 4 tiles, as SmolVLM-256M's 2048 over its 512 px tile): an image becomes up to 4 x 4 tiles of
    64 px, row by row, + the global image, each 16 tokens, between the processor's ``<row_R_col_C>`` markers.

    ``arch="smolvlm"`` saves the same model as ``SmolVLMForConditionalGeneration`` (SmolVLM2's class,
    vision ``smolvlm_vision``) with the same Idefics3 processor (SmolVLM2's own processor needs torchvision)."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        LlamaConfig,
        PreTrainedTokenizerFast,
    )

    from edgesdk.formats.gguf.build import PPL_TEXT

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specials = [
        "<|im_start|>",
        "<|im_end|>",
        "<end_of_utterance>",
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
    ] + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    lines = PPL_TEXT.read_text().split("\n")
    corpus = lines + ["\n\n".join(lines[i : i + 3]) for i in range(0, len(lines), 3)] + ["User:", "Assistant:"] * 20
    tok = byte_bpe(corpus, 420, specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        additional_special_tokens=specials[2:],
    )
    assert len(fast("\n\n", add_special_tokens=False)["input_ids"]) == 1, "\\n\\n must be one token"
    image_processor = Idefics3ImageProcessor(
        do_convert_rgb=True,
        do_resize=True,
        size={"longest_edge": IDEFICS3_IMAGE_SIZE * (4 if image_splitting else 1)},
        resample=1,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_pad=True,
        do_image_splitting=image_splitting,
        max_image_size={"longest_edge": IDEFICS3_IMAGE_SIZE},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=fast,
        image_seq_len=IDEFICS3_IMAGE_TOKENS,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(directory)
    text = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        initializer_range=0.2,
    )
    vision = {
        "image_size": IDEFICS3_IMAGE_SIZE,
        "patch_size": IDEFICS3_PATCH_SIZE,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    }
    config_cls, model_cls = (Idefics3Config, Idefics3ForConditionalGeneration)
    if arch == "smolvlm":
        from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

        config_cls, model_cls = SmolVLMConfig, SmolVLMForConditionalGeneration
    config = config_cls(
        vision_config=vision,
        text_config=text.to_dict(),
        scale_factor=IDEFICS3_SCALE_FACTOR,
        image_token_id=fast.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# tiny-smolvlm (random weights)\n\nA SmolVLM-style (Idefics3) model built "
        "from transformers configs with RANDOM weights for tests: it describes nothing.\n",
        encoding="utf-8",
    )
    return directory


# ------------------------------------------------------------------ the transformers 5 layout of a 4.57 save

TRANSFORMERS5_VERSION = "5.25.0"
# transformers 5.x (checked on 5.17.0 and 5.25.0) drops the ``vision_model.`` level of a SigLIP tower; 5.0.0 kept it
_V5_VISION_STRIP = ("vision_tower.vision_model.", "vision_tower.")


def to_transformers5_layout(src: Path, dst: Path) -> Path:
    """Copy a directory saved by transformers 4.57 (one of this module's fixtures, or a causal LM) into ``dst`` as
    transformers 5 saves the same model. CI has transformers 4.57 only, so the 5.x layout is derived here; the
    mapping was checked against real saves of the same fixtures with transformers 5.25.0 (tensor names, the files
    present, config.json, generation_config.json, processor_config.json, tokenizer_config.json and tokenizer.json
    equal to what this writes, transformers_version and the random weight values aside; 5.17.0 differs only in
    writing Idefics3's top-level ``pad_token_id`` unrenamed, 5.0.0 also in keeping LLaVA's ``vision_model.``
    level; docs/vlm.md):

    * tensors: LLaVA's SigLIP tower loses its ``vision_model.`` level (``vision_tower.encoder...``, 5.17+);
      the decoder, the projector and every Idefics3 / SmolVLM and llama / qwen2 name stay;
    * config.json (top level and ``text_config``): ``rope_theta`` + ``rope_scaling`` become ``rope_parameters:
      {rope_theta, rope_type}``, ``tie_word_embeddings`` is written explicitly, ``pad_token_id: null`` where
      there was none (Idefics3's top-level ``pad_token_id`` is written ``_pad_token_id``, its text_config gains
      ``eos_token_id``);
    * ``preprocessor_config.json`` and ``special_tokens_map.json`` are gone: the image processor is the
      ``image_processor`` object of ``processor_config.json`` (without ``processor_class``);
    * tokenizer_config.json: ``tokenizer_class: TokenizersBackend``, ``backend: tokenizers``, no
      ``added_tokens_decoder`` / ``clean_up_tokenization_spaces``, ``additional_special_tokens`` as the
      ``extra_special_tokens`` list, named extra tokens (``image_token``) at the top level;
    * tokenizer.json: a ``TemplateProcessing`` post-processor that adds nothing, where 4.57 wrote none;
    * generation_config.json gains ``output_attentions``, ``output_hidden_states`` and ``use_cache``."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    arch = (config.get("architectures") or [""])[0]
    llava = arch == "LlavaForConditionalGeneration"
    siglip_tower = llava or arch == "Gemma3ForConditionalGeneration"  # vision_tower = a SiglipVisionModel
    for f in src.iterdir():
        if f.name in ("preprocessor_config.json", "special_tokens_map.json"):
            continue
        if f.suffix == ".safetensors":
            tensors = load_file(str(f))
            if siglip_tower:
                tensors = {
                    (_V5_VISION_STRIP[1] + k[len(_V5_VISION_STRIP[0]) :] if k.startswith(_V5_VISION_STRIP[0]) else k): v
                    for k, v in tensors.items()
                }
            save_file(tensors, str(dst / f.name), metadata={"format": "pt"})
        elif f.is_file():
            shutil.copyfile(f, dst / f.name)

    def rope(cfg: dict) -> dict:
        out = {}
        for k, v in cfg.items():
            if k == "rope_scaling":
                continue
            if k == "rope_theta":
                out["rope_parameters"] = {"rope_theta": v, **(cfg.get("rope_scaling") or {"rope_type": "default"})}
                continue
            out[k] = v
        return out

    text = config.get("text_config")
    if isinstance(text, dict):  # a VLM
        text = rope(text)
        text.setdefault("pad_token_id", None)
        text["tie_word_embeddings"] = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
        config["text_config"] = text
        config["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", False))
        if not siglip_tower:  # Idefics3 / SmolVLM
            if "pad_token_id" in config:
                config["_pad_token_id"] = config.pop("pad_token_id")
            gen = json.loads((src / "generation_config.json").read_text())
            text.setdefault("eos_token_id", gen.get("eos_token_id"))
            text.pop("pad_token_id") if text["pad_token_id"] is None else None
    else:  # a causal LM
        config = rope(config)
        config.setdefault("pad_token_id", None)
    config["transformers_version"] = TRANSFORMERS5_VERSION
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    if (src / "generation_config.json").is_file():
        gen = json.loads((src / "generation_config.json").read_text())
        gen.update(
            output_attentions=False,
            output_hidden_states=False,
            use_cache=True,
            transformers_version=TRANSFORMERS5_VERSION,
        )
        (dst / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")

    if (src / "preprocessor_config.json").is_file():
        image = json.loads((src / "preprocessor_config.json").read_text())
        image.pop("processor_class", None)
        proc = (
            json.loads((src / "processor_config.json").read_text()) if (src / "processor_config.json").is_file() else {}
        )
        (dst / "processor_config.json").write_text(
            json.dumps({**proc, "image_processor": image}, indent=2, sort_keys=True) + "\n"
        )

    if not (src / "tokenizer_config.json").is_file():
        return dst
    tc = json.loads((src / "tokenizer_config.json").read_text())
    for k in ("added_tokens_decoder", "clean_up_tokenization_spaces"):
        tc.pop(k, None)
    named = tc.pop("extra_special_tokens", None) or {}
    tc.update(named if isinstance(named, dict) else {})
    tc["extra_special_tokens"] = [
        t["content"] if isinstance(t, dict) else t for t in tc.pop("additional_special_tokens", [])
    ]
    if not tc["extra_special_tokens"] and not named and not llava:
        del tc["extra_special_tokens"]
    tc.update(backend="tokenizers", tokenizer_class="TokenizersBackend")
    (dst / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")

    tok = json.loads((src / "tokenizer.json").read_text())
    if tok.get("post_processor") is None:
        seq = [{"Sequence": {"id": "A", "type_id": 0}}]
        tok["post_processor"] = {
            "type": "TemplateProcessing",
            "single": seq,
            "pair": seq + [{"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {},
        }
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2))
    return dst


# ------------------------------------------------------------------ Gemma-3 vision (random weights)

# google/gemma-3-4b-it's published config.json / preprocessor_config.json values that the tiny model keeps: SigLIP
# tower (patch 14, gelu_pytorch_tanh, layer-norm eps 1e-6, post_layernorm, no head) pooled by 4 x 4 average pooling
# (64 patches per side -> mm_tokens_per_image 256 = 16 x 16), soft-emb RMS norm (1 + w) + input projection; gemma3
# decoder with head_dim independent of the width (2560 wide, 8 heads of 256, 4 KV heads, query_pre_attn_scalar =
# head_dim), rope_theta 1e6 with a linear factor 8 on the global layers, rope_local_base_freq 1e4 on the sliding ones,
# 5 sliding : 1 global (sliding_window 1024), rms_norm_eps 1e-6, tied output, a vocabulary padded past the tokenizer
# (262208 rows for 262145 tokens: 63 rows more), <start_of_image> / <image_soft_token> / <end_of_image>, eos
# [<eos>, <end_of_turn>]; Gemma3ImageProcessor: bilinear resize to the square image size, mean = std = 0.5, no pan
# and scan. Shrunk: image 224 px (16 patches per side; mm_tokens_per_image 16 = 4 x 4 keeps the 4 x 4 pooling
# kernel), tower 2 layers of width 64 (4 heads, FFN 240), decoder 6 layers (5 sliding + 1 global) of width 160
# (4 heads of 32, 2 KV heads: the heads' width 128 is 0.8 of the model's, as 2048 is of 2560, FFN 640).
GEMMA3_IMAGE_SIZE = 224
GEMMA3_PATCH_SIZE = 14
GEMMA3_IMAGE_TOKENS = 16
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% if messages[0]['content'] is string %}{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% else %}{% set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' %}{% endif %}"
    "{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}"
    "{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def _gemma3_tokenizer():
    """Gemma's tokenizer.json shape (BPE with byte fallback, spaces as "▁", no "▁" prepended, <bos> added by a
    TemplateProcessing post-processor) with the Gemma-3 chat and image tokens, trained on the built-in text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from edgesdk.formats.gguf.build import PPL_TEXT

    lines = PPL_TEXT.read_text().split("\n")
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    special = [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<start_of_turn>",
        "<end_of_turn>",
        "<start_of_image>",
        "<end_of_image>",
        "<image_soft_token>",
    ] + [f"<0x{i:02X}>" for i in range(256)]
    corpus = lines + ["\n\n".join(lines[i : i + 3]) for i in range(0, len(lines), 3)] + ["user\n", "model\n"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=760, special_tokens=special))
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )


def make_tiny_gemma3(directory: Path, *, seed: int = 0, layout: str = "transformers4", **text_overrides) -> Path:
    """Save a random-weight ``Gemma3ForConditionalGeneration`` built from Gemma-3-4B's published configuration,
    shrunk (above), in ``directory``. RANDOM weights: it describes nothing. Norm weights (HF initialises them to 0,
    scaled as 1 + w) and the input projection (HF initialises it to 0) are randomised, so a missed ``+ 1`` or a
    transposed projection shows in the parity. ``layout="transformers5"``: saved by this transformers 4.57, then
    rewritten as transformers 5 saves it (:func:`to_transformers5_layout`, with Gemma-3's rope per layer type; checked
    against a real transformers 5.25.0 save of the same model: tensor names, config.json, generation_config.json,
    processor_config.json (its PIL image processor), tokenizer_config.json and tokenizer.json equal).
    ``text_overrides`` change text_config values (a test's smaller sliding_window)."""
    import json

    import torch
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    final = Path(directory)
    directory = final.with_name(final.name + "-tf4") if layout == "transformers5" else final
    directory.mkdir(parents=True, exist_ok=True)
    fast = _gemma3_tokenizer()
    image_processor = Gemma3ImageProcessor(
        size={"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE},
        resample=2,
        do_resize=True,
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=None,
        do_pan_and_scan=None,
    )
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=fast,
        image_seq_length=GEMMA3_IMAGE_TOKENS,
        chat_template=GEMMA3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(directory)
    eot = fast.convert_tokens_to_ids("<end_of_turn>")
    text = Gemma3TextConfig(
        **{
            **dict(
                vocab_size=len(fast) + 63,
                hidden_size=160,
                intermediate_size=640,
                num_hidden_layers=6,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=32,
                query_pre_attn_scalar=32,
                rope_theta=1_000_000.0,
                rope_local_base_freq=10_000.0,
                rope_scaling={"rope_type": "linear", "factor": 8.0},
                sliding_window=1024,
                hidden_activation="gelu_pytorch_tanh",
                rms_norm_eps=1e-6,
                max_position_embeddings=131072,
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
                tie_word_embeddings=True,
                bos_token_id=fast.bos_token_id,
                eos_token_id=fast.eos_token_id,
                pad_token_id=fast.pad_token_id,
                initializer_range=0.06,
            ),
            **text_overrides,
        }
    )
    vision = SiglipVisionConfig(
        image_size=GEMMA3_IMAGE_SIZE,
        patch_size=GEMMA3_PATCH_SIZE,
        hidden_size=64,
        intermediate_size=240,
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        vision_use_head=False,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=GEMMA3_IMAGE_TOKENS,
        boi_token_index=fast.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=fast.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=fast.convert_tokens_to_ids("<image_soft_token>"),
        eos_token_id=[fast.eos_token_id, eot],
        initializer_range=0.2,
    )
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "vision_tower" not in name:  # Gemma3RMSNorm: 1 + w
                p.copy_(0.1 * torch.randn_like(p))
            elif name.endswith("mm_input_projection_weight"):
                p.copy_(torch.randn_like(p) / p.shape[0] ** 0.5)
    model.generation_config.eos_token_id = [fast.eos_token_id, eot]
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "README.md").write_text(
        "---\nlicense: apache-2.0\n---\n# tiny-gemma3-vision (random weights)\n\nGemma-3-4B's architecture (shrunk) "
        "built from transformers configs with RANDOM weights for tests: it describes nothing.\n",
        encoding="utf-8",
    )
    if layout != "transformers5":
        return directory
    out = to_transformers5_layout(directory, final)
    cfg = json.loads((out / "config.json").read_text())
    tc = cfg["text_config"]  # transformers 5's Gemma3TextConfig: rope per layer type, no rope_local_base_freq
    tc["rope_parameters"] = {
        "full_attention": tc.pop("rope_parameters"),
        "sliding_attention": {"rope_theta": tc.pop("rope_local_base_freq"), "rope_type": "default"},
    }
    tc.update(
        bos_token_id=text.bos_token_id,
        eos_token_id=text.eos_token_id,
        pad_token_id=text.pad_token_id,
        tie_word_embeddings=True,
    )  # Gemma-3's defaults, which 4.57 leaves out and 5.x writes
    cfg["tie_word_embeddings"] = True
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    proc = json.loads((out / "processor_config.json").read_text())  # 5.x leaves out the unset pan-and-scan keys
    proc["image_processor"] = {
        k: v for k, v in proc["image_processor"].items() if v is not None or k == "do_convert_rgb"
    }
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2, sort_keys=True) + "\n")
    return out
