"""The torch side: chunk tensors (``pages``) and the accelerator <-> host copies (``transfer``).

The only part of the core that imports torch; nothing outside it and the engine integrations does.
"""
