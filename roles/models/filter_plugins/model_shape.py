"""models role: an installed model's config.json against the shapes the render sized the image by.

The render decides from profiles/_catalog.yaml how the model splits over tensor parallelism,
whether a draft's attention needs its own FA3 schedule, and how large the KV cache is; the
checkpoint the build downloads is the truth. A catalog entry that disagrees with it would make an
image that fails at its first request, or later, so the build stops instead.
"""

from __future__ import annotations

from typing import Any


def model_shape_mismatches(config: dict[str, Any], shape: dict[str, int]) -> list[str]:
    """`key got (the catalog: want)` for each field of `shape` the config disagrees with."""
    # The speculators format (RedHatAI's heads) nests the decoder layer's fields.
    layer = config.get("transformer_layer_config") or config
    out = []
    for key, want in shape.items():
        got = layer.get(key)
        if got is None and key == "head_dim" and layer.get("num_attention_heads"):
            # Llama configs before head_dim was written out: hidden size over heads
            got = layer.get("hidden_size", 0) // layer["num_attention_heads"]
        if got != want:
            out.append(f"{key} {'missing' if got is None else got} (the catalog: {want})")
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"model_shape_mismatches": model_shape_mismatches}
