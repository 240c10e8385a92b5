"""``kvtier plan``: should I tier, and how big? Answered from a request trace.

Modules, one concept each:

* ``trace``: the trace format (JSONL, versioned header) and its writer; ``trace_read``: the
  streaming reader; ``recorder``: ``TraceRecorder``, a bounded background writer for engines;
* ``synth``: synthetic workloads; ``events``: traces from captured vLLM-format KV events;
* ``stack``: LRU stack distances (exact, Fenwick tree; SHARDS sampling beyond a budget);
  ``sim``: kvtier's own policy classes and ``HostTier`` driven by a trace;
* ``reuse``: reuse by chunk size, reuse-distance histograms; ``curves``: hit-ratio curves;
  ``analysis``: all measurements of one trace;
* ``cost``: throughputs, calibration, headroom, bytes moved; ``verdict``: the recommendation;
* ``report``: text, JSON, config and chart outputs; ``cli``: ``kvtier plan`` and ``kvtier trace``.
"""
