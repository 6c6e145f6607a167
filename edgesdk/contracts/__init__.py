# SPDX-License-Identifier: Apache-2.0
"""What the build writes and the runtime reads, in the lowest layer so that both (and the profiles, the planner,
the profiler and the license scan) import it without importing each other (issue 40, item 5):

* :mod:`.gguf_types`: the GGUF type table (llama.cpp's file-type numbers, bits per weight, K/V cache arithmetic);
* :mod:`.gguf_header`: the one GGUF header reader (standard library only);
* :mod:`.speculative`: speculative decoding's cost model (the plan's k and the engine's adaptive k);
* :mod:`.vlm_encoder`: the ONNX vision-encoder artifact of a VLM bundle (input/output names, normalisation);
* :mod:`.vlm_families`: the runtime side of each VLM family record (prompt, chat format, image preprocessing);
  the build side (converter, checks, tensor names) is :mod:`edgesdk.formats.vlm.families`.

Its modules import nothing of edgesdk above the lowest layer (docs/architecture.md's Layers line;
tests/test_import_graph.py) and no optional extra at module level.
"""
