"""A kvtier layout for an engine's bytes kept as they are (an opaque row or page span).

kvtier sizes host slots and chunk files from ``KVLayout.chunk_bytes``; an engine integration
that stores the engine's own bytes (vLLM's host rows, SGLang's page spans) describes them as
uint8 "heads" of the right size, so a kvtier instance built with the same identity (a peer
server, say) has slots exactly that long.
"""

from __future__ import annotations

from kvtier.layout import KVLayout


def byte_layout(
    bytes_per_block: int, tokens_per_block: int, blocks_per_chunk: int, num_layers: int
) -> KVLayout:
    """A layout whose ``chunk_bytes`` is ``bytes_per_block * blocks_per_chunk``.

    When the bytes do not split into K and V per token and layer, coarser shapes of the same
    size are used.
    """
    for layers, tokens in ((num_layers, tokens_per_block), (1, tokens_per_block), (1, 1)):
        if bytes_per_block > 0 and bytes_per_block % (2 * layers * tokens) == 0:
            head_dim = bytes_per_block // (2 * layers * tokens)
            return KVLayout(layers, 1, head_dim, "uint8", tokens, blocks_per_chunk)
    return KVLayout(max(1, num_layers), 1, 1, "uint8", tokens_per_block, blocks_per_chunk)
