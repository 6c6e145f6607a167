# SPDX-License-Identifier: Apache-2.0
"""`edgesdk serve` on a VLM bundle (the tiny random-weight LLaVA of tests/vlm_fixtures.py) with the real `openai`
client: ``image_url`` parts as data URLs, local files only under ``--allow-local-images DIR``, http(s) URLs,
unreadable images, pixel bombs and other media types refused with 400 naming the field; greedy replies equal to
``edgesdk run --image`` / ``edgesdk run --chat --image`` on the same image and prompt; the image-feature cache
shared by concurrent requests."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_image_inputs import png_bomb  # noqa: E402  (tests/ on sys.path)
from test_serve import ServerProcess  # noqa: E402
from vlm_fixtures import make_test_images  # noqa: E402

pytestmark = pytest.mark.slow
PROMPT = "What is on the table?"


@pytest.fixture(scope="module")
def vlm_bundle(vlm_f16_bundle):
    """tests/conftest.py's tiny LLaVA F16 build, once per session (read-only: copy it before changing it)."""
    return vlm_f16_bundle


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    return make_test_images(tmp_path_factory.mktemp("allowed"))


@pytest.fixture(scope="module")
def server(vlm_bundle, images, tmp_path_factory):
    srv = ServerProcess(
        [vlm_bundle, "--name", "vlm", "--allow-local-images", images[0].parent], tmp_path_factory.mktemp("serve-vlm")
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def data_url(path: Path) -> str:
    kind = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg", "webp": "webp"}[path.suffix[1:].lower()]
    return f"data:image/{kind};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def ask(client, url: str, text: str = PROMPT, **kw):
    return client.chat.completions.create(
        model="vlm",
        max_tokens=6,
        temperature=0,
        messages=[
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}],
            }
        ],
        **kw,
    )


def refused(client, url: str, param: str, match: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, url)
    body = err.value.body
    assert err.value.status_code == 400 and body["param"] == param, body
    assert match in body["message"], body


def test_data_url_reply_equals_edgesdk_run_on_the_same_image(client, vlm_bundle, images, run_cli):
    for image in (images[2], images[0]):  # a JPEG, a PNG
        reply = ask(client, data_url(image))
        text = reply.choices[0].message.content
        assert reply.usage.prompt_tokens > 16  # the 16 image tokens are counted
        for chat in ((), ("--chat",)):
            proc = run_cli(
                "run", vlm_bundle, *chat, "--image", image, "--prompt", PROMPT, "-n", "6", "--temp", "0", "--json"
            )
            assert proc.returncode == 0, proc.stderr
            out = json.loads(proc.stdout)
            assert out["text"] == text, (chat, out["text"], text)
            assert out["usage"]["prompt_tokens"] == reply.usage.prompt_tokens
    streamed = "".join(
        c.choices[0].delta.content or "" for c in ask(client, data_url(images[0]), stream=True) if c.choices
    )
    assert streamed == ask(client, data_url(images[0])).choices[0].message.content


def test_completions_on_a_vlm_equal_edgesdk_run_without_an_image(client, vlm_bundle, run_cli):
    """/v1/completions on a VLM: the text prompt in the family's user turn, as `edgesdk run --prompt` (no image)."""
    text = client.completions.create(model="vlm", prompt=PROMPT, max_tokens=4, temperature=0).choices[0].text
    proc = run_cli("run", vlm_bundle, "--prompt", PROMPT, "-n", "4", "--temp", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["text"] == text
    many = client.completions.create(model="vlm", prompt=[PROMPT, PROMPT], max_tokens=4, temperature=0)
    assert [c.text for c in sorted(many.choices, key=lambda c: c.index)] == [text, text]


def test_local_files_only_under_the_allowed_directory(client, images, tmp_path):
    by_path = ask(client, str(images[0])).choices[0].message.content
    assert ask(client, "file://" + str(images[0])).choices[0].message.content == by_path
    assert ask(client, data_url(images[0])).choices[0].message.content == by_path
    outside = tmp_path / "outside.png"
    outside.write_bytes(images[0].read_bytes())
    where = "messages[0].content[0].image_url.url"
    refused(client, str(outside), where, "not a file under the allowed directory")
    refused(client, str(images[0].parent / ".." / outside.parent.name / "outside.png"), where, "under")
    (images[0].parent / "escape.png").symlink_to(outside)  # a link out of the directory is outside too
    refused(client, str(images[0].parent / "escape.png"), where, "not a file under the allowed directory")
    refused(client, "relative.png", where, "absolute path")


def test_bad_images_are_400_naming_the_field(client, images, tmp_path):
    where = "messages[0].content[0].image_url.url"
    refused(client, "https://example.com/cat.png", where, "offline by design")
    refused(client, "http://127.0.0.1/cat.png", where, "not fetched")
    junk = "data:image/png;base64," + base64.b64encode(b"this is not an image at all").decode()
    refused(client, junk, where, "not a readable image")
    whole = images[0].read_bytes()
    cut = "data:image/png;base64," + base64.b64encode(whole[: len(whole) // 2]).decode()
    refused(client, cut, where, "not a readable image")
    refused(client, "data:image/png;base64,@@not-base64@@", where, "not valid base64")
    refused(client, "data:image/gif;base64,R0lGODlhAQABAAAAACw=", where, "image/png, image/jpeg or image/webp")
    refused(client, "data:image/png," + "x" * 10, where, "base64-encoded")
    bomb = png_bomb(tmp_path / "bomb.png", side=5000)  # 25 M pixels in 30 kB: over the 4096 x 4096 limit
    refused(client, data_url(bomb), where, "refused before decoding")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="vlm",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": data_url(images[0]), "detail": "high"}}],
                }
            ],
        )
    assert err.value.body["param"] == "messages[0].content[0].image_url.detail"


def test_structured_output_and_logprobs_work_for_a_vlm(client, images):
    """A VLM's requests run in the continuous-batching engine: a JSON-object reply follows the grammar from its first
    token, and each generated token comes with its log-probability."""
    reply = ask(client, data_url(images[0]), response_format={"type": "json_object"})
    assert reply.choices[0].message.content.lstrip().startswith("{")
    scored = ask(client, data_url(images[0]), logprobs=True, top_logprobs=2)
    tokens = scored.choices[0].logprobs.content
    assert len(tokens) == scored.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in tokens)
    assert all(t.logprob <= 0 for t in tokens)


def test_concurrent_image_chats_batch_in_the_engine(client, images):
    """Four clients with four images at once: every reply equals the same request alone (the tiny model's logits
    have clear winners)."""
    alone = [ask(client, data_url(p)).choices[0].message.content for p in images[:4]]
    got: dict[int, str] = {}

    def one(i: int) -> None:
        got[i] = ask(client, data_url(images[i])).choices[0].message.content

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i] for i in range(4)] == alone


def test_size_limit_is_checked_before_decoding(images):
    """The byte limit: the base64 text's length decides, before a byte of it is decoded."""
    from edgesdk.serve.images import ImageError, ImagePolicy, image_part

    def never(w, h, what):  # the size check must not be reached
        raise AssertionError("decoded")

    policy = ImagePolicy(check_size=never, max_bytes=1000)
    big = "data:image/png;base64," + "A" * 4000
    with pytest.raises(ImageError, match="refused before decoding") as err:
        image_part({"type": "image_url", "image_url": {"url": big}}, "messages[0].content[0]", policy, "m")
    assert err.value.param == "messages[0].content[0].image_url.url"


def test_feature_cache_is_shared_by_concurrent_requests(vlm_bundle, images):
    """Four threads ask about one image on one session: the encoder runs once, every reply is the same."""
    from PIL import Image

    import edgesdk

    with edgesdk.load(vlm_bundle) as s:
        msgs = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": Image.open(images[1]).convert("RGB")},
                    {"type": "text", "text": PROMPT},
                ],
            }
        ]
        replies: list[str] = []

        def one() -> None:
            replies.append(str(s.chat(msgs, max_tokens=4, temperature=0)))

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(replies) == 4 and len(set(replies)) == 1
        assert s.backend.report()["encoder_runs"] == 1 and s.backend.last["images_cached"] == 1


def test_run_chat_with_an_image_and_a_chat_template_on_a_vlm(vlm_bundle, images, run_cli):
    proc = run_cli("run", vlm_bundle, "--chat", "--image", images[0], "--prompt", PROMPT, "-n", "2")
    assert proc.returncode == 0, proc.stderr  # was exit 3: unknown generation option(s): chat_template
    bad = run_cli("run", vlm_bundle, "--chat-template", "gemma", "--image", images[0], "--prompt", PROMPT)
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1 and "applies to GGUF bundles" in bad.stderr


def test_serve_flags_that_apply_to_no_served_bundle_are_refused(vlm_bundle, images, run_cli, tmp_path):
    for args, message in (
        (["--chat-template", "gemma"], "none of these is one (vlm)"),
        (["--allow-local-images", tmp_path / "missing"], "not a directory"),
    ):
        proc = run_cli("serve", vlm_bundle, *args, "--port", "0")
        assert proc.returncode == 3 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
