# SPDX-License-Identifier: Apache-2.0
"""VLM image inputs that must be refused as InputError (exit 3) naming the image, before any large decode
(issue 25 finding 8): decompression bombs (a small PNG whose header says 20000x20000, a 54-byte BMP header),
a multi-GB file named .png (a sparse file: no disk used), files Pillow cannot read, empty, non-finite and
out-of-range arrays, extreme aspect ratios. Real Pillow on crafted bytes, the runtime's own
``ImagePreprocessor``; the CLI cases against a real bundle are in tests/test_vlm.py."""

from __future__ import annotations

import struct
import subprocess
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from edgesdk.errors import InputError  # noqa: E402
from edgesdk.runtime.backends.vlm import MAX_IMAGE_BYTES, ImagePreprocessor  # noqa: E402

SIGLIP_64 = {"size": {"height": 64, "width": 64}, "resample": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
CLIP_336 = {
    "size": {"shortest_edge": 336},
    "crop_size": {"height": 336, "width": 336},
    "do_center_crop": True,
    "resample": 3,
}


def png_bomb(path: Path, side: int = 20000) -> Path:
    """A 1-bit greyscale PNG of side x side zero pixels: ~50 MB of scanlines deflated to tens of KB."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    comp, row, parts = zlib.compressobj(9), b"\0" * (1 + (side + 7) // 8), []
    for _ in range(side):
        parts.append(comp.compress(row))
    parts.append(comp.flush())
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")
    )
    return path


def bmp_header(path: Path, width: int, height: int) -> Path:
    """A 54-byte BMP: file header + BITMAPINFOHEADER for width x height 24-bit pixels, and no pixel data."""
    row = (width * 3 + 3) // 4 * 4
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, row * height & 0xFFFFFFFF, 2835, 2835, 0, 0)
    path.write_bytes(b"BM" + struct.pack("<IHHI", (54 + row * height) & 0xFFFFFFFF, 0, 0, 54) + info)
    return path


@pytest.fixture
def pre() -> ImagePreprocessor:
    return ImagePreprocessor(SIGLIP_64, 64)


def test_png_bomb_is_refused_from_its_header(pre, tmp_path):
    bomb = png_bomb(tmp_path / "bomb.png")
    assert bomb.stat().st_size < 100_000  # a small file that would decode to 400 M pixels
    tracemalloc.start()
    with pytest.raises(InputError, match=r"bomb\.png: 400,000,000 pixels is more than this model takes"):
        pre.load(bomb)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * 2**20  # nothing decoded
    with pytest.raises(InputError, match="image bytes"):  # the same bytes in memory
        pre.load(bomb.read_bytes())


def test_png_over_the_models_limit_but_under_pillows_is_refused(pre, tmp_path):
    # 6000 x 6000 = 36 M pixels: Pillow's own bomb check (89 M warning, 179 M error) lets it through
    bomb = png_bomb(tmp_path / "big.png", 6000)
    with pytest.raises(InputError, match=r"big\.png: 6000x6000 pixels is more than this model takes"):
        pre.load(bomb)


def test_bmp_headers_are_refused(pre, tmp_path):
    huge = bmp_header(tmp_path / "huge.bmp", 50000, 50000)
    assert huge.stat().st_size == 54
    with pytest.raises(InputError, match=r"huge\.bmp.*refused before decoding"):
        pre.load(huge)
    big = bmp_header(tmp_path / "big.bmp", 5000, 5000)
    with pytest.raises(InputError, match=r"big\.bmp: 5000x5000 pixels"):
        pre.load(big)
    small = bmp_header(tmp_path / "truncated.bmp", 100, 100)  # in the limit, but no pixel data
    with pytest.raises(InputError, match=r"truncated\.bmp: not a readable image"):
        pre.load(small)


def test_a_2_gb_file_named_png_is_refused_unread(pre, tmp_path):
    big = tmp_path / "huge.png"
    subprocess.run(["truncate", "-s", "2G", str(big)], check=True)  # sparse: no disk blocks
    assert big.stat().st_size == 2 * 2**30 > MAX_IMAGE_BYTES
    tracemalloc.start()
    with pytest.raises(InputError, match=r"huge\.png: the file is 2,147,483,648 bytes.*refused unread"):
        pre.load(big)
    under = tmp_path / "zeros.png"  # under the byte cap: Pillow reads a header's worth and gives up
    subprocess.run(["truncate", "-s", str(MAX_IMAGE_BYTES - 1), str(under)], check=True)
    with pytest.raises(InputError, match=r"zeros\.png: not a readable image"):
        pre.load(under)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * 2**20  # neither file was read whole


def test_garbage_and_missing_files(pre, tmp_path):
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"\xff\xd8\xff" + b"\x00" * 100)
    with pytest.raises(InputError, match=r"junk\.jpg: not a readable image"):
        pre.load(junk)
    with pytest.raises(InputError, match="image not found"):
        pre.load(tmp_path / "nope.png")
    with pytest.raises(InputError, match="not a readable image"):
        pre.load(b"")


@pytest.mark.parametrize(
    "array, match",
    [
        (np.zeros((0, 0, 3), np.uint8), r"empty \(0x0 pixels\)"),
        (np.zeros((4, 0, 3), np.uint8), r"empty \(0x4 pixels\)"),
        (np.full((8, 8, 3), np.nan, np.float32), "NaN or infinite"),
        (np.full((8, 8, 3), np.inf), "NaN or infinite"),
        (np.full((8, 8, 3), 300.0), r"within 0\.\.255"),
        (np.full((8, 8, 3), -1, np.int16), r"within 0\.\.255"),
        (np.zeros((8, 8, 4), np.uint8), "HxWx3"),
        (np.zeros((8, 8), np.uint8), "HxWx3"),
        (np.array([[["a"] * 3]], dtype=object), "numeric"),
        (np.zeros((1, 1000, 3), np.uint8), "aspect ratio above 200:1"),
        (np.zeros((5000, 5000, 3), np.uint8), "5000x5000 pixels is more than this model takes"),
    ],
)
def test_bad_arrays_are_refused(pre, array, match):
    with pytest.raises(InputError, match="image array: .*" + match):
        pre.load(array)


def test_empty_pil_image_is_refused(pre):
    from PIL import Image

    with pytest.raises(InputError, match=r"PIL image: the image is empty \(0x0"):
        pre.load(Image.new("RGB", (0, 0)))


def test_valid_images_still_load(pre, tmp_path):
    from PIL import Image

    arr = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(arr).save(tmp_path / "ok.png")
    _, img = pre.load(tmp_path / "ok.png")
    assert pre(img).shape == (64, 64, 3)
    _, img2 = pre.load("file://" + str(tmp_path / "ok.png"))
    assert np.array_equal(np.asarray(img2), arr)
    _, img3 = pre.load(arr.astype(np.float64))  # finite floats within 0..255 are cast as before
    assert np.array_equal(np.asarray(img3), arr)


def test_limit_grows_with_the_model_input():
    assert ImagePreprocessor(SIGLIP_64, 64).max_pixels() == 4096**2  # the floor
    assert ImagePreprocessor(CLIP_336, 336).max_pixels() == (16 * 336) ** 2
    assert (
        ImagePreprocessor({"size": {"longest_edge": 1536}, "max_image_size": {"longest_edge": 384}}, 384).max_pixels()
        == (16 * 1536) ** 2
    )
