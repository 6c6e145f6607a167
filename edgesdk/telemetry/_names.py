# SPDX-License-Identifier: Apache-2.0
"""Attribute and metric names: the semantic-conventions package's constants where they exist,
our ``edgesdk.*`` names otherwise, and the advised histogram buckets (semconv v1.41.1)."""

from __future__ import annotations

import json

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as G
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as M
from opentelemetry.semconv.attributes import error_attributes, server_attributes

from edgesdk import __version__ as SDK_VERSION  # noqa: F401 - re-exported for the tracer/meter scope

SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.1"

# --- GenAI span attributes (constants from opentelemetry-semantic-conventions 0.66b2) ---
OPERATION_NAME = G.GEN_AI_OPERATION_NAME
PROVIDER_NAME = G.GEN_AI_PROVIDER_NAME
REQUEST_MODEL = G.GEN_AI_REQUEST_MODEL
REQUEST_STREAM = G.GEN_AI_REQUEST_STREAM
RESPONSE_MODEL = G.GEN_AI_RESPONSE_MODEL
RESPONSE_FINISH_REASONS = G.GEN_AI_RESPONSE_FINISH_REASONS
RESPONSE_ID = G.GEN_AI_RESPONSE_ID
RESPONSE_TIME_TO_FIRST_CHUNK = G.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK
USAGE_INPUT_TOKENS = G.GEN_AI_USAGE_INPUT_TOKENS
USAGE_OUTPUT_TOKENS = G.GEN_AI_USAGE_OUTPUT_TOKENS
TOKEN_TYPE = G.GEN_AI_TOKEN_TYPE
INPUT_MESSAGES = G.GEN_AI_INPUT_MESSAGES
OUTPUT_MESSAGES = G.GEN_AI_OUTPUT_MESSAGES
EMBEDDINGS_DIMENSION_COUNT = G.GEN_AI_EMBEDDINGS_DIMENSION_COUNT
ERROR_TYPE = error_attributes.ERROR_TYPE
SERVER_ADDRESS = server_attributes.SERVER_ADDRESS
SERVER_PORT = server_attributes.SERVER_PORT

# request dict key -> (attribute, python type). top_k is a double in the conventions.
REQUEST_PARAMS = {
    "max_tokens": (G.GEN_AI_REQUEST_MAX_TOKENS, int),
    "temperature": (G.GEN_AI_REQUEST_TEMPERATURE, float),
    "top_p": (G.GEN_AI_REQUEST_TOP_P, float),
    "top_k": (G.GEN_AI_REQUEST_TOP_K, float),
    "seed": (G.GEN_AI_REQUEST_SEED, int),
    "frequency_penalty": (G.GEN_AI_REQUEST_FREQUENCY_PENALTY, float),
    "presence_penalty": (G.GEN_AI_REQUEST_PRESENCE_PENALTY, float),
    "stop_sequences": (G.GEN_AI_REQUEST_STOP_SEQUENCES, list),
    "choice_count": (G.GEN_AI_REQUEST_CHOICE_COUNT, int),
    "encoding_formats": (G.GEN_AI_REQUEST_ENCODING_FORMATS, list),
}

# --- metrics ---
CLIENT_OPERATION_DURATION = M.GEN_AI_CLIENT_OPERATION_DURATION
CLIENT_TOKEN_USAGE = M.GEN_AI_CLIENT_TOKEN_USAGE
CLIENT_TIME_TO_FIRST_CHUNK = M.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK
CLIENT_TIME_PER_OUTPUT_CHUNK = M.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK
SERVER_TIME_TO_FIRST_TOKEN = M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN
SERVER_TIME_PER_OUTPUT_TOKEN = M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN

# Advised bucket boundaries (semconv v1.41.1, docs/gen-ai/gen-ai-metrics.md).
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
TOKEN_BUCKETS = [4 ** i for i in range(14)]  # 1, 4, 16 ... 67108864
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]

# --- edgesdk conventions (docs/telemetry.md) ---
DEVICE_PROFILE = "edgesdk.device.profile"
BACKEND = "edgesdk.backend"
PRECISION = "edgesdk.precision"
BUNDLE_ID = "edgesdk.bundle.id"
CAPTURE_MARKER = "edgesdk.capture_content"
BUILD_SPAN = "edgesdk.build"
BUILD_MODEL = "edgesdk.build.model"
BUILD_OUTCOME = "edgesdk.build.outcome"
BUILD_STAGE = "edgesdk.build.stage"
BUILD_STAGE_OUTCOME = "edgesdk.build.stage.outcome"
BUILD_STAGES = ("export", "convert", "optimize", "quantize", "engine", "verify", "license_gate", "package")
BUILD_STAGE_DURATION = "edgesdk.build.stage.duration"
FALLBACK_EVENT = "edgesdk.fallback"
FALLBACK_FROM = "edgesdk.fallback.from"
FALLBACK_TO = "edgesdk.fallback.to"
FALLBACK_REASON = "edgesdk.fallback.reason"

_SCALARS = (str, bool, int, float)


def clean_attributes(attributes: dict) -> dict:
    """Keep OTel-valid values: scalars and homogeneous sequences; anything else becomes its str()."""
    out = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, _SCALARS):
            out[str(key)] = value
        elif isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            out[str(key)] = list(value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
            out[str(key)] = list(value)
        else:
            out[str(key)] = str(value)
    return out


def request_attributes(request: dict) -> dict:
    out = {}
    for key, value in request.items():
        if value is None:
            continue
        known = REQUEST_PARAMS.get(key)
        if known is None:
            out[f"edgesdk.request.{key}"] = value if isinstance(value, _SCALARS) else str(value)
            continue
        name, kind = known
        if key == "choice_count" and int(value) == 1:
            continue  # conditionally required only when != 1
        if kind is list:
            values = [value] if isinstance(value, str) else [str(v) for v in value]
            out[name] = values
        else:
            out[name] = kind(value)
    return out


def error_type(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", None) else f"{module}.{cls.__qualname__}"


def error_description(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200]


def text_messages(role: str, content, finish_reason: str | None = None) -> str:
    """Serialize content to the conventions' message JSON (gen_ai.input/output.messages schemas)."""
    if isinstance(content, str):
        items = [{"role": role, "content": content}]
    else:
        items = list(content)
    messages = []
    for item in items:
        if isinstance(item, str):
            item = {"role": role, "content": item}
        text = item.get("content", "")
        message = {"role": item.get("role", role),
                   "parts": [{"type": "text", "content": text if isinstance(text, str) else str(text)}]}
        if finish_reason is not None:
            message["finish_reason"] = finish_reason
        messages.append(message)
    return json.dumps(messages, ensure_ascii=False)
