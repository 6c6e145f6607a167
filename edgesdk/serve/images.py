# SPDX-License-Identifier: Apache-2.0
"""``image_url`` content parts of chat requests to a VLM bundle: what is accepted and how it is checked.

* ``data:image/png|jpeg|webp;base64,...`` URLs: the image travels in the request. Its size is checked before
  anything is decoded: the base64 text against :attr:`ImagePolicy.max_bytes`, then the image header's format,
  width x height against the model's pixel limit (the VLM preprocessor's, 16x its input side squared, at least
  4096 x 4096) and aspect ratio, then the image tokens every image of the request becomes (from the header's
  size: the family's frames times the bundle's tokens per frame) against the model's context; only then are the
  pixels decoded, off the event loop (:func:`decode_images`, on a thread). An image Pillow cannot read is a 400.
* ``http://`` / ``https://`` URLs are refused (400): the device is offline by design, the server fetches nothing.
* Local files (``file:///...`` or an absolute path) only under ``edgesdk serve --allow-local-images DIR``, and only
  inside DIR once symbolic links and ``..`` are resolved; the same size checks apply.

Every refusal is an :class:`ImageError` naming the request field (``messages[0].content[1].image_url.url``),
which the HTTP layer answers as 400 in OpenAI's error shape with that ``param``. A part is first
``{"type": "image", "image": PendingImage}`` (header read, nothing decoded); :func:`decode_images` makes it the
``<PIL image>`` the VLM gets; its features are cached by the VLM runtime (keyed by the preprocessed pixels' sha256
and the encoder's), shared by every request to that model.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.errors import InputError

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # per image, as OpenAI's limit; --max-body-bytes bounds the request too
FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}  # data URL media type -> Pillow format
_DATA_URL = re.compile(r"data:([^;,]*)((?:;[^;,]*)*),", re.IGNORECASE)


class ImageError(Exception):
    """An image part the server will not take: ``param`` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ImagePolicy:
    """What one served VLM accepts: local files only under ``allow_local`` (None: none), at most ``max_bytes``
    per image, and ``check_size(width, height, what)`` (the model's pixel and aspect limits; raises
    InputError) on the header before decoding."""

    check_size: Callable[[int, int, str], None]
    allow_local: Path | None = None
    max_bytes: int = MAX_IMAGE_BYTES
    image_tokens: Callable[[int, int], int | None] | None = None  # (width, height) -> image tokens (None: unknown)
    context: int | None = None  # the model's context in tokens: a request's images must take fewer


@dataclass
class PendingImage:
    """An image part whose header is read and checked (format, size, image tokens) and whose pixels are not
    decoded yet: ``image`` is Pillow's lazily opened image (:func:`decode_images` decodes it)."""

    image: Any
    what: str
    where: str
    tokens: int | None  # image tokens it becomes in this model (None: unknown)

    @property
    def size(self) -> tuple[int, int]:
        return int(self.image.size[0]), int(self.image.size[1])


def allowed_dir(value: str | os.PathLike[str] | None) -> Path | None:
    """``--allow-local-images DIR`` as a resolved directory (InputError if it is not one)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise InputError(f"--allow-local-images {value}: not a directory")
    return path.resolve()


def image_part(part: dict[str, Any], param: str, policy: ImagePolicy | None, model: str) -> dict[str, Any]:
    """One ``{"type": "image_url", "image_url": {"url": ...}}`` part -> ``{"type": "image", "image": PendingImage}``
    (the header read and checked, no pixel decoded: :func:`decode_images`); :class:`ImageError` naming the field
    for anything not taken."""
    if policy is None:
        raise ImageError(f"model {model!r} takes text only: image_url parts need a VLM bundle", param)
    spec = part.get("image_url")
    if isinstance(spec, str):  # some clients send the URL itself
        spec = {"url": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("url"), str) or not spec["url"]:
        raise ImageError(f"{param}.image_url must be an object with a 'url' string", f"{param}.image_url")
    for key, value in spec.items():
        if key == "detail":
            if value not in (None, "auto"):
                raise ImageError(
                    f"{param}.image_url.detail {str(value)[:20]!r} is not supported: the model "
                    'preprocesses every image its own way (accepted: "auto" or null)',
                    f"{param}.image_url.detail",
                )
        elif key != "url":
            raise ImageError(
                f"{param}.image_url.{key[:40]}: unknown field (url and detail only)", f"{param}.image_url.{key[:40]}"
            )
    url, where = spec["url"], f"{param}.image_url.url"
    if url[:5].lower() == "data:":
        data = _data_url(url, where, policy)
        what = f"{where} (data URL, {len(data):,} bytes)"
    elif url.lower().startswith(("http://", "https://")):
        raise ImageError(
            f"{where}: image URLs are not fetched (the device is offline by design); send the image "
            "inline as a data URL (data:image/png;base64,...)",
            where,
        )
    else:
        data = _local_file(url, where, policy)
        what = f"{where} ({url[:80]})"
    img = _open(data, what, where, policy)
    w, h = int(img.size[0]), int(img.size[1])
    tokens = policy.image_tokens(w, h) if policy.image_tokens is not None else None
    return {"type": "image", "image": PendingImage(img, what, where, tokens)}


def _data_url(url: str, where: str, policy: ImagePolicy) -> bytes:
    m = _DATA_URL.match(url)
    if m is None:
        raise ImageError(f"{where}: not a data URL (data:image/png;base64,...)", where)
    media, params = m.group(1).strip().lower(), [p.strip().lower() for p in m.group(2).split(";") if p.strip()]
    kind = media.removeprefix("image/") if media.startswith("image/") else None
    if kind not in FORMATS:
        raise ImageError(
            f"{where}: media type {media[:40]!r} is not taken (image/png, image/jpeg or image/webp)", where
        )
    if "base64" not in params:
        raise ImageError(f"{where}: the data URL must be base64-encoded (data:{media};base64,...)", where)
    payload = url[m.end() :]
    if len(payload) // 4 * 3 > policy.max_bytes:
        raise ImageError(
            f"{where}: the image is about {len(payload) // 4 * 3:,} bytes, more than the "
            f"{policy.max_bytes:,} this server takes per image; refused before decoding",
            where,
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"{where}: the data URL is not valid base64 ({exc})", where) from None


def _local_file(url: str, where: str, policy: ImagePolicy) -> bytes:
    if policy.allow_local is None:
        raise ImageError(
            f"{where}: local image paths are refused (start the server with --allow-local-images DIR "
            "to serve files under DIR, or send a data URL)",
            where,
        )
    raw = url[len("file://") :] if url.lower().startswith("file://") else url
    if not raw.startswith("/"):
        raise ImageError(
            f"{where}: a local image must be an absolute path or a file:/// URL under {policy.allow_local}", where
        )
    try:
        path = Path(raw).resolve(strict=True)
    except (OSError, RuntimeError):
        raise ImageError(f"{where}: no such file under {policy.allow_local}", where) from None
    if not path.is_relative_to(policy.allow_local) or not path.is_file():
        raise ImageError(f"{where}: not a file under the allowed directory {policy.allow_local}", where)
    size = path.stat().st_size
    if size > policy.max_bytes:
        raise ImageError(
            f"{where}: the file is {size:,} bytes, more than the {policy.max_bytes:,} this server "
            "takes per image; refused unread",
            where,
        )
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ImageError(f"{where}: cannot read it ({type(exc).__name__})", where) from None


def _open(data: bytes, what: str, where: str, policy: ImagePolicy) -> Any:
    """The header only (format; width x height against the model's limits), as the VLM runtime opens an image
    (:func:`edgesdk.runtime.backends.vlm.open_image`); PNG, JPEG or WebP only. No pixel is decoded."""
    from edgesdk.runtime.backends.vlm import open_image

    try:
        img = open_image(io.BytesIO(data), what, policy.check_size)
    except InputError as exc:
        raise ImageError(str(exc), where) from None
    if img.format not in set(FORMATS.values()):
        raise ImageError(f"{what}: a {img.format} image; PNG, JPEG or WebP are taken", where)
    return img


def pending_images(messages: list[dict[str, Any]]) -> list[PendingImage]:
    """The image parts of ``messages`` not decoded yet, in order."""
    return [
        p["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image" and isinstance(p.get("image"), PendingImage)
    ]


def check_image_tokens(messages: list[dict[str, Any]], policy: ImagePolicy) -> None:
    """InputError when the images of ``messages`` alone (counted from their headers) take the model's whole
    context: the request could only be refused after decoding them (30 images of 4096 x 4096 held the event loop
    for 16 s, then the prompt was too long anyway). The prompt's text comes on top, checked by the runtime."""
    images = pending_images(messages)
    counts = [p.tokens for p in images if p.tokens is not None]
    if policy.context is None or not counts:
        return
    total = sum(counts)
    if total >= policy.context:
        largest = max(images, key=lambda p: p.tokens or 0)
        raise InputError(
            f"the {len(images)} images take at least {total:,} image tokens, more than the context holds "
            f"({policy.context:,} tokens; the largest, {largest.size[0]}x{largest.size[1]} pixels, takes "
            f"{largest.tokens:,}): refused before decoding them (send fewer or smaller images)"
        )


def decode_images(messages: list[dict[str, Any]]) -> None:
    """Decode every :class:`PendingImage` of ``messages`` in place (the part's ``image`` becomes the decoded PIL
    image); :class:`ImageError` naming the field of one that cannot be decoded. Blocking: run it on a thread
    (``asyncio.to_thread``), never on the event loop."""
    from edgesdk.runtime.backends.vlm import load_pixels

    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for p in content:
            pending = p.get("image") if p.get("type") == "image" else None
            if isinstance(pending, PendingImage):
                try:
                    p["image"] = load_pixels(pending.image, pending.what)
                except InputError as exc:
                    raise ImageError(str(exc), pending.where) from None


def text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with image parts left out and text parts joined (the view a text-only check takes)."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        out.append({**m, "content": content})
    return out


def vlm_policy(session: Any, allow_local: Path | None, max_bytes: int = MAX_IMAGE_BYTES) -> ImagePolicy | None:
    """The image policy of a loaded session: a VLM's (a :class:`~edgesdk.runtime.backend.VisionBackend`: its
    preprocessor's size check, image tokens, a slot's context), else None (text only)."""
    from edgesdk.runtime.backend import VisionBackend

    backend = session.backend
    if not isinstance(backend, VisionBackend):
        return None
    limits = backend.image_limits()
    return ImagePolicy(
        check_size=limits.check_size,
        allow_local=allow_local,
        max_bytes=max_bytes,
        image_tokens=limits.image_tokens,
        context=limits.context or None,
    )
