"""Adapters between kvtier and real engines (``transformers``; ``vllm`` later).

Each adapter uses only the engine-facing API of ``TieringManager`` and the transfer engine, and
is imported on its own (``from kvtier.integrations.transformers import ...``) so that importing
``kvtier`` never pulls in an engine.
"""
