# SPDX-License-Identifier: Apache-2.0
"""Embeddings with token-id input (issue 23): ``input`` as a list of integers or a list of such lists, as the
OpenAI API allows and LangChain's ``OpenAIEmbeddings()`` sends by default. A real ``edgesdk serve`` of a real
MiniLM ONNX bundle, driven by the real ``openai`` client: the ids of a text embed as the text does (cosine >=
0.9999, same usage), a too-long input is truncated as text is, an id outside the vocabulary is a 400 naming
``input`` (and does not fail the requests it would have shared a batch with).

LangChain's default ``OpenAIEmbeddings`` is not driven here: it makes its ids with tiktoken, whose encoding
file is a download this offline machine cannot make (docs/serve.md says what its ids mean for a local model)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from tests.test_serve import ServerProcess  # noqa: E402

TEXTS = ["This is a test of token-id input.", "Edge devices run small models.", "héllo wörld, naïve café"]
LONG = " ".join(f"word{i} and the quick brown fox" for i in range(120))  # ~1,000 tokens: past MiniLM's 256


@pytest.fixture(scope="module")
def minilm_bundle(minilm_cpu_fp32):
    """tests/conftest.py's FP32, built once per session (read-only: copy it before changing it)."""
    return minilm_cpu_fp32


@pytest.fixture(scope="module")
def tokenizer(minilm_bundle):
    """The bundle's own tokenizer.json, untruncated and unpadded: the ids a client would send for a text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(minilm_bundle) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


@pytest.fixture(scope="module")
def server(minilm_bundle, tmp_path_factory):
    srv = ServerProcess([minilm_bundle, "--name", "minilm"], tmp_path_factory.mktemp("ids-serve"))
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _vectors(resp) -> np.ndarray:
    return np.asarray([d.embedding for d in sorted(resp.data, key=lambda d: d.index)], dtype=np.float64)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_token_ids_embed_as_their_text(client, tokenizer):
    ids = [tokenizer.encode(t).ids for t in TEXTS]
    assert ids[0][0] == 101 and ids[0][-1] == 102  # [CLS] ... [SEP], as the example sends them
    by_text = client.embeddings.create(model="minilm", input=TEXTS)
    by_ids = client.embeddings.create(model="minilm", input=ids)
    assert _cosines(_vectors(by_text), _vectors(by_ids)).min() >= 0.9999
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == sum(map(len, ids))
    one = client.embeddings.create(model="minilm", input=ids[1], encoding_format="float")  # one list of ints
    assert len(one.data) == 1 and _cosines(_vectors(one), _vectors(by_text)[1:2])[0] >= 0.9999


def test_too_long_token_ids_are_truncated_as_text_is(client, tokenizer):
    ids = tokenizer.encode(LONG).ids
    assert len(ids) > 600
    by_text = client.embeddings.create(model="minilm", input=[LONG])
    by_ids = client.embeddings.create(model="minilm", input=[ids])
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == 256  # sentence-transformers' max_seq_length
    assert _cosines(_vectors(by_text), _vectors(by_ids))[0] >= 0.9999


@pytest.mark.parametrize(
    "bad,says",
    [
        ([[101, 30522, 102]], "outside this model's vocabulary"),
        ([[101, 7592, 102], [101, 99999999, 102]], "input[1] holds token id 99999999"),
        ([[101, -1, 102]], "token ids must be from 0"),
        ([[101, True, 102]], "not a mix or other values"),
        ([[101, 102], "text"], "not a mix or other values"),
        ([[101, 102], []], "empty token-id lists"),
        ([], "non-empty"),
    ],
)
def test_bad_token_ids_are_400_naming_input(server, bad, says):
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "minilm", "input": bad}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input" and says in err["message"], err


def test_unknown_and_wrong_fields_are_400_naming_them(server):
    for body, param in (
        ({"input": "x", "truncate": True}, "truncate"),
        ({"input": "x", "user": 5}, "user"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ):
        r = httpx.post(server.url + "/v1/embeddings", json={"model": "minilm", **body}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_bad_id_request_does_not_fail_its_batch_neighbours(server, tokenizer):
    ids = [tokenizer.encode(t).ids for t in TEXTS]

    async def main():
        a = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        good = [a.embeddings.create(model="minilm", input=[ids[i % 3]]) for i in range(8)]
        good += [a.embeddings.create(model="minilm", input=TEXTS[i % 3]) for i in range(8)]
        bad = a.embeddings.create(model="minilm", input=[[101, 40000, 102]])
        return await asyncio.gather(*good, bad, return_exceptions=True)

    results = asyncio.run(main())
    assert isinstance(results[-1], openai.BadRequestError)
    assert all(len(r.data[0].embedding) == 384 for r in results[:-1]), results[:-1]


def test_python_api_embeds_token_ids(minilm_bundle, tokenizer):
    import edgesdk
    from edgesdk.errors import InputError

    with edgesdk.load(minilm_bundle, threads=2) as s:
        ids = [tokenizer.encode(t).ids for t in TEXTS]
        mixed = s.embed([TEXTS[0], ids[1], TEXTS[2]])
        ref = s.embed(TEXTS)
        assert _cosines(mixed.astype(np.float64), ref.astype(np.float64)).min() >= 0.9999
        assert s.count_tokens([TEXTS[0], ids[1]]) == [len(ids[0]), len(ids[1])]
        with pytest.raises(InputError, match=r"input\[0\] holds token id 30522"):
            s.embed([[101, 30522, 102]])


def test_langchain_with_the_documented_setting(server, client):
    """docs/serve.md's LangChain setting (``check_embedding_ctx_length=False``: send the text) gives the vectors
    the openai client gets. Its default (tiktoken ids in OpenAI's vocabulary) is not run: see the module doc."""
    lc = pytest.importorskip("langchain_openai")
    emb = lc.OpenAIEmbeddings(
        model="minilm", base_url=server.url + "/v1", api_key="x", check_embedding_ctx_length=False, max_retries=0
    )
    got = np.asarray(emb.embed_documents(TEXTS), dtype=np.float64)
    ref = _vectors(client.embeddings.create(model="minilm", input=TEXTS))
    assert _cosines(got, ref).min() >= 0.9999
    assert _cosines(np.asarray([emb.embed_query(TEXTS[1])]), ref[1:2])[0] >= 0.9999
