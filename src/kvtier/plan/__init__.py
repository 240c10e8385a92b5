"""``kvtier plan``: should I tier, and how big? Answered from a request trace.

Modules, one concept each:

* ``trace``: the trace format (JSONL, versioned header) and its writer; ``trace_read``: the
  streaming reader; ``recorder``: ``TraceRecorder``, a bounded background writer for engines;
  ``budget``: how ``--memory-budget`` is shared out between lines, parsing and the analysis;
* ``synth``: synthetic workloads; ``trace_from_events``: traces from captured vLLM-format KV
  events, decoded by ``event_capture`` (msgpack objects of a capture, each within a limit);
* ``stack``: LRU stack distances (exact, Fenwick tree; SHARDS sampling beyond a budget);
  ``sim``: kvtier's own policy classes and ``HostTier`` driven by a trace;
* ``reuse``: reuse by chunk size, reuse-distance histograms; ``curves``: hit-ratio curves;
  ``analysis``: all measurements of one trace;
* ``cost``: throughputs, calibration, headroom, bytes moved; ``verdict``: the recommendation;
* ``report``: text, JSON, config and chart outputs; ``cli``: ``kvtier plan`` and ``kvtier trace``.
"""
