# SPDX-License-Identifier: Apache-2.0
"""Attribute and metric names of the GenAI semantic conventions v1.41.1 as plain strings, our
``edgesdk.*`` names, and the advised histogram buckets.

Plain strings, not the ``opentelemetry-semantic-conventions`` constants: the base install depends
on ``opentelemetry-api`` only (tests/test_telemetry.py checks these against that package's
``gen_ai_attributes`` / ``gen_ai_metrics`` when it is installed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from edgesdk import __version__ as SDK_VERSION  # noqa: F401 - re-exported for the tracer/meter scope

SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.1"

# --- GenAI span attributes ---
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
TOKEN_TYPE = "gen_ai.token.type"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"

# request dict key -> (attribute, python type). top_k is a double in the conventions.
REQUEST_PARAMS = {
    "max_tokens": ("gen_ai.request.max_tokens", int),
    "temperature": ("gen_ai.request.temperature", float),
    "top_p": ("gen_ai.request.top_p", float),
    "top_k": ("gen_ai.request.top_k", float),
    "seed": ("gen_ai.request.seed", int),
    "frequency_penalty": ("gen_ai.request.frequency_penalty", float),
    "presence_penalty": ("gen_ai.request.presence_penalty", float),
    "stop_sequences": ("gen_ai.request.stop_sequences", list),
    "choice_count": ("gen_ai.request.choice.count", int),
    "encoding_formats": ("gen_ai.request.encoding_formats", list),
}

# --- metrics ---
CLIENT_OPERATION_DURATION = "gen_ai.client.operation.duration"
CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
CLIENT_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
CLIENT_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
SERVER_REQUEST_DURATION = "gen_ai.server.request.duration"
# edgesdk serve's own metrics (/metrics, docs/serve.md): Prometheus names are these with dots made underscores.
SERVE_REQUESTS = "edgesdk.serve.requests"
SERVE_REJECTED = "edgesdk.serve.rejected"
SERVE_CANCELLED = "edgesdk.serve.cancelled"
# The conventions have no server token metric (gen_ai.client.token.usage is the client's): ours, in our namespace.
SERVE_TOKEN_USAGE = "edgesdk.serve.token.usage"
SERVE_QUEUE_DEPTH = "edgesdk.serve.queue_depth"
SERVE_EMBEDDING_BATCH_SIZE = "edgesdk.serve.embedding_batch_size"
SERVE_PROMPT_CACHE_REUSED = "edgesdk.serve.prompt_cache.reused_tokens"
SERVE_PROMPT_CACHE = "edgesdk.serve.prompt_cache"
SERVE_SLOTS = "edgesdk.serve.slots"
SERVE_SLOTS_BUSY = "edgesdk.serve.slots.busy"
SERVE_SPECULATIVE_TOKENS = "edgesdk.serve.speculative.tokens"

# Advised bucket boundaries (semconv v1.41.1, docs/gen-ai/gen-ai-metrics.md).
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
TOKEN_BUCKETS = [4**i for i in range(14)]  # 1, 4, 16 ... 67108864
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
# Inference-stage child spans (InferenceRecorder.stage): INTERNAL spans named after the stage, under
# the request's GenAI span; not GenAI operations themselves, so they carry no gen_ai.* attribute.
INFERENCE_STAGE = "edgesdk.inference.stage"
INFERENCE_STAGES = ("preprocess", "encode", "prefill", "decode")

_SCALARS = (str, bool, int, float)


def clean_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Keep OTel-valid values: scalars and homogeneous sequences; anything else becomes its str()."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, _SCALARS):
            out[str(key)] = value
        elif (
            isinstance(value, list | tuple)
            and value
            and (all(isinstance(v, str) for v in value) or all(isinstance(v, int | float) for v in value))
        ):
            out[str(key)] = list(value)
        else:
            out[str(key)] = str(value)
    return out


def request_attributes(request: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
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
            out[name] = [value] if isinstance(value, str) else [str(v) for v in value]
        else:
            out[name] = kind(value)
    return out


def error_type(exc: BaseException) -> str:
    module, name = type(exc).__module__, type(exc).__qualname__
    return name if module in ("builtins", None) else f"{module}.{name}"


def error_description(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def text_messages(role: str, content, finish_reason: str | None = None) -> str:
    """Serialize content to the conventions' message JSON (gen_ai.input/output.messages schemas)."""
    messages = []
    for item in [content] if isinstance(content, str) else list(content):
        if isinstance(item, str):
            item = {"role": role, "content": item}
        text = item.get("content", "")
        message = {
            "role": item.get("role", role),
            "parts": [{"type": "text", "content": text if isinstance(text, str) else str(text)}],
        }
        if finish_reason is not None:
            message["finish_reason"] = finish_reason
        messages.append(message)
    return json.dumps(messages, ensure_ascii=False)
