"""What every engine integration shares and no engine owns (nothing here imports an engine).

* ``keymap``: an engine's own block or page key to a kvtier ``ChunkKey`` under a cache identity,
  and recent ones back (for removal events);
* ``byte_layout``: a kvtier ``KVLayout`` whose chunk is exactly an engine's host row or page
  span, when kvtier stores the engine's bytes as they are;
* ``tier_fit``: a tier's configuration fitted to host memory kvtier does not own (O_DIRECT
  off over rows it cannot move in place).
"""
