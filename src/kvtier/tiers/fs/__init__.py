"""The filesystem tier: chunk files under a local or shared directory (``tier.FilesystemTier``).

``tier`` (the tier and its jobs), ``files`` (chunk files: write, read, verify, scan),
``index`` (what is on disk and its bytes, bounded by ``max_bytes``), ``io`` (vectored and
O_DIRECT reads and writes), ``paths`` (opening entries without following links),
``namespace`` (the directory of one cache identity, and starting read-only on a full disk).
"""
