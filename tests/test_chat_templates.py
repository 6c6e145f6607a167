# SPDX-License-Identifier: Apache-2.0
"""Chat templates chosen at build time from the architecture (plan decision ``gguf.chat_template``), bundled as
``chat_template.jinja`` and used by default; ``build --chat-template`` / ``serve --chat-template`` override.

On the registry's Gemma-3-270M GGUF (no ``tokenizer.chat_template``): the plan (JSON and ``--explain``) names the
shipped ``gemma`` template; ``edgesdk serve`` on the bundle answers ``/v1/chat/completions`` with the real
``openai`` client, token for token what ``Session.chat`` gives; ``serve --chat-template FILE`` formats with FILE.
A Llama (an architecture without one turn format) without a template builds for completions, its plan says "no
chat template", and chat is refused naming the templates and the flag."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp")

from cli_fixtures import THREADS  # noqa: E402

from edgesdk.formats.gguf.archs import ARCHS, chat_template_for  # noqa: E402
from edgesdk.formats.gguf.chat_templates import names  # noqa: E402

GEMMA_LICENSE = "LicenseRef-gemma"
MESSAGES = [{"role": "user", "content": "Write one sentence about the sea."}]
# a turn format unlike Gemma's: what the server formats with when --chat-template names this file
PLAIN = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def test_the_registry_maps_architectures_to_shipped_templates():
    for rec in ARCHS.values():
        assert rec.chat_template is None or rec.chat_template in names(), rec
    assert chat_template_for("gemma3") == chat_template_for("Gemma3ForCausalLM") == "gemma"
    assert chat_template_for("qwen2") == chat_template_for("Qwen3ForCausalLM") == "chatml"
    assert chat_template_for("phi3") == "phi-3" and chat_template_for("MistralForCausalLM") == "mistral"
    assert chat_template_for("llama") is None  # llama.cpp's llama is Llama 2, Llama 3 and Mistral
    assert chat_template_for("LlamaForCausalLM") is None and chat_template_for("mamba") is None


@pytest.mark.slow
def test_plan_json_and_explain_show_the_decision(gemma_gguf, run_cli, tmp_path):
    proc = run_cli("build", gemma_gguf, "--profile", "cpu-x86_64", "--plan-only", "--json")
    assert proc.returncode == 0, proc.stderr
    decisions = {d["key"]: d for d in json.loads(proc.stdout)["decisions"]}
    d = decisions["gguf.chat_template"]
    assert d["value"] == {"template": "gemma", "source": "architecture"}
    assert "architecture gemma3" in d["reason"] and "no chat template" in d["reason"]
    text = run_cli("build", gemma_gguf, "--profile", "cpu-x86_64", "--plan-only")
    assert text.returncode == 0 and "gguf.chat_template" in text.stdout and "shipped gemma template" in text.stdout
    tpl = tmp_path / "plain.jinja"
    tpl.write_text(PLAIN)
    for spec, want in (("chatml", "chatml"), (str(tpl), str(tpl.resolve()))):
        proc = run_cli("build", gemma_gguf, "--profile", "cpu-x86_64", "--plan-only", "--json", "--chat-template", spec)
        assert proc.returncode == 0, proc.stderr
        value = {d["key"]: d["value"] for d in json.loads(proc.stdout)["decisions"]}["gguf.chat_template"]
        assert value == {"template": want, "source": "requested"}
    bad = run_cli("build", gemma_gguf, "--profile", "cpu-x86_64", "--plan-only", "--chat-template", "gemma4")
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1
    assert "neither a shipped name (chatml, gemma, llama-2, llama-3, mistral, phi-3)" in bad.stderr


@pytest.fixture(scope="module")
def gemma_arch_bundle(gemma_cpu_bundle):
    """tests/conftest.py's Gemma cpu-x86_64 bundle, built once per session (read-only: copy it before changing it)."""
    return gemma_cpu_bundle


@pytest.mark.slow
def test_serve_chats_with_the_template_from_the_architecture(gemma_arch_bundle, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_serve import ServerProcess

    import edgesdk
    from edgesdk.resources import read_data_text

    m = json.loads((gemma_arch_bundle / "manifest.json").read_text())
    assert {a["path"]: a["role"] for a in m["artifacts"]}["chat_template.jinja"] == "chat_template"
    assert m["extras"]["llm"]["chat_template_bundled"] == {
        "template": "gemma",
        "source": "architecture",
        "file": "chat_template.jinja",
    }
    assert (gemma_arch_bundle / "chat_template.jinja").read_text() == read_data_text("chat_templates", "gemma.jinja")
    tpl = tmp_path / "plain.jinja"
    tpl.write_text(PLAIN)
    with edgesdk.load(gemma_arch_bundle, threads=THREADS) as s:
        want = str(s.chat(MESSAGES, max_tokens=12, temperature=0))
        want_tokens = s.backend.last["input_tokens"]
        gemma_prompt = "<start_of_turn>user\nWrite one sentence about the sea.<end_of_turn>\n<start_of_turn>model\n"
        assert want_tokens == len(s.backend.engine.tokenize(gemma_prompt, add_bos=True, special=True))
        plain = str(s.chat(MESSAGES, max_tokens=12, temperature=0, chat_template=str(tpl)))
        plain_tokens = s.backend.last["input_tokens"]
    assert plain_tokens != want_tokens
    for extra, text, n_in in (
        ([], want, want_tokens),
        (["--chat-template", tpl], plain, plain_tokens),
        (["--parallel", "2"], None, want_tokens),
    ):  # continuous batching formats it too
        srv = ServerProcess([gemma_arch_bundle, "--name", "gemma", "--parallel", "1", *extra], tmp_path)
        try:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
            reply = client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=12, temperature=0)
            assert reply.usage.prompt_tokens == n_in, extra
            assert text is None or reply.choices[0].message.content == text, extra
            with pytest.raises(openai.BadRequestError) as err:  # a text-only model: image parts are refused
                client.chat.completions.create(
                    model="gemma",
                    messages=[
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
                        }
                    ],
                )
            assert (
                err.value.body["param"] == "messages[0].content[0]" and "takes text only" in err.value.body["message"]
            )
        finally:
            assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.mark.slow
def test_an_architecture_without_a_template_builds_for_completions_and_refuses_chat(tmp_path, run_cli):
    pytest.importorskip("transformers")
    from test_gguf_build import make_tiny_causal_lm

    import edgesdk
    from edgesdk.build import build, make_plan
    from edgesdk.errors import InputError
    from edgesdk.plan import BuildOptions

    src = make_tiny_causal_lm(tmp_path / "tiny-llama", "llama")
    own = next(d for d in make_plan(src, "cpu-x86_64").decisions if d.key == "gguf.chat_template")
    assert own.value == {"template": None, "source": "gguf"}  # its own template: nothing bundled
    cfg = src / "tokenizer_config.json"
    cfg.write_text(json.dumps({k: v for k, v in json.loads(cfg.read_text()).items() if k != "chat_template"}))
    (src / "chat_template.jinja").unlink(missing_ok=True)
    out = build(src, "cpu-x86_64", tmp_path / "b", BuildOptions(progress=False))
    m = json.loads((out / "manifest.json").read_text())
    d = next(d for d in m["plan"]["decisions"] if d["key"] == "gguf.chat_template")
    assert d["value"] == {"template": None, "source": "none"} and d["reason"].startswith("no chat template")
    assert "chat_template" not in {a["role"] for a in m["artifacts"]}
    with edgesdk.load(out) as s:
        assert s.generate("The sea", max_tokens=3, temperature=0).usage["completion_tokens"] >= 1
        with pytest.raises(
            InputError,
            match=r"no chat template .*chatml, gemma, llama-2, llama-3, mistral, "
            r"phi-3.*edgesdk run/serve --chat-template NAME\|FILE",
        ):
            s.chat(MESSAGES, max_tokens=2)
    proc = run_cli("run", out, "--chat", "--chat-template", "chatml", "--prompt", "hi", "-n", "2")
    assert proc.returncode == 0, proc.stderr


def test_build_chat_template_on_a_plan_without_gguf_is_refused(minilm_dir, run_cli):
    proc = run_cli("build", minilm_dir, "--profile", "cpu-x86_64", "--plan-only", "--chat-template", "gemma")
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--chat-template bundles a chat template with a GGUF build; this plan builds onnx" in proc.stderr
