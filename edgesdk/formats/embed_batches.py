# SPDX-License-Identifier: Apache-2.0
"""How :meth:`edgesdk.runtime.session.Session.embed` groups texts into backend calls, in a module below both
the runtime and the builds: the ONNX build verifies padded-batch parity grouped exactly this way
(:mod:`edgesdk.formats.onnx.parity`), and the session runs it (both import it from here).
"""

from __future__ import annotations

# embed() runs at most this many texts per backend call: memory grows with batch x padded length^2
# (attention), so one call with 1,000 texts would otherwise be one huge batch.
EMBED_MAX_BATCH = 32
# ... and a batch never mixes texts whose token counts differ by more than this factor. INT8 bundles
# quantize activations with one scale per tensor, i.e. per batch: a 256-token neighbour widened the
# scale of a short text's rows and took MiniLM INT8 from min cosine 0.997 (alone) to 0.994
# (docs/int8.md, "Padding and batching"). Grouping by length also skips most of the padded compute.
EMBED_MAX_LENGTH_RATIO = 2.0


def plan_embed_batches(
    lengths: list[int], max_batch: int = EMBED_MAX_BATCH, max_ratio: float = EMBED_MAX_LENGTH_RATIO
) -> list[list[int]]:
    """Indices of ``lengths`` (token counts) grouped as :meth:`Session.embed` runs them: sorted by length,
    at most ``max_batch`` per batch, the longest at most ``max_ratio`` x the shortest of its batch."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j]):
        if current and (len(current) >= max_batch or lengths[i] > max_ratio * max(lengths[current[0]], 1)):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
