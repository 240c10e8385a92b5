"""``kvtier bench --admission``: admission policies side by side on the mixed workload.

Every policy serves the same ``MixedWorkload`` (reused conversations among one-shot prompts)
with the same engine, accelerator pool, host memory and secondary tiers; only the
``admission`` of its ``TieringConfig`` differs. Policies (``policies``):

* ``admit all``: no admission, what kvtier does by default;
* ``host min_reuse 2``: host memory keeps a chunk from its second sighting on (vLLM's
  ``store_threshold: 2``); what host memory drops reaches no tier either;
* ``host frequency 2``: TinyLFU-style, host memory keeps a chunk whose recent frequency
  (halved every ``frequency_window`` sightings) reaches 2;
* ``tiers min_reuse 2`` (with the secondary tiers of ``--config``): host memory keeps
  everything, the secondary tiers only chunks seen twice.

As in ``runner``, the policies take turns request by request at each N, so a noisy machine
slows them alike, and every run has its own key salt, so no policy is served what another
stored. The tiers are host memory alone, or those of ``--config FILE`` (its ``admission`` and
``store_threshold`` are replaced by each policy's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvtier.bench.engine import RunResult, Strategy, StrategyRun
from kvtier.bench.mixed import MixedSpec, MixedWorkload
from kvtier.bench.runner import Bench, BenchOptions, _tier_label, take_turns
from kvtier.config.schema import TieringConfig
from kvtier.control.admission import AdmissionConfig
from kvtier.identity import CacheIdentity

ADMIT_ALL = "admit all"

#: ``kvtier bench --admission`` without ``--conversations``: one N where host memory could hold
#: every conversation, were it not for the one-shots.
ADMISSION_CONVERSATIONS = (8,)


@dataclass(frozen=True)
class AdmissionOptions:
    """The bench's options, plus the one-shots and the frequency filter's window.

    ``one_shot_tokens`` ``None``: as long as a conversation's first prompt.
    ``frequency_window`` ``None``: 8 times the host slots (old sightings fade after about 8
    host memories' worth of chunks went by).
    """

    bench: BenchOptions
    one_shots_per_round: int = 16
    one_shot_tokens: int | None = None
    frequency_window: int | None = None

    def spec(self, num_conversations: int, vocab_size: int) -> MixedSpec:
        conversations = self.bench.spec(num_conversations, vocab_size)
        tokens = self.one_shot_tokens or self.bench.first_prompt_tokens
        return MixedSpec(conversations, self.one_shots_per_round, tokens)


@dataclass(frozen=True)
class Policy:
    """A name and the ``admission`` entries it puts in the configuration."""

    name: str
    admission: tuple[AdmissionConfig, ...]

    def describe(self) -> list[dict[str, Any]]:
        return [_changed(config) for config in self.admission]


def _changed(config: AdmissionConfig) -> dict[str, Any]:
    """The fields of ``config`` that differ from their defaults (``level`` always)."""
    default = AdmissionConfig()
    names = [f.name for f in dataclasses.fields(config)]
    return {
        name: getattr(config, name)
        for name in names
        if name == "level" or getattr(config, name) != getattr(default, name)
    }


def policies(tier_names: list[str], frequency_window: int) -> list[Policy]:
    """The policies compared, in order; ``tiers min_reuse 2`` only with secondary tiers."""
    found = [
        Policy(ADMIT_ALL, ()),
        Policy("host min_reuse 2", (AdmissionConfig("host", min_reuse=2),)),
        Policy(
            "host frequency 2",
            (AdmissionConfig("host", min_frequency=2, frequency_window=frequency_window),),
        ),
    ]
    if tier_names:
        tiers = tuple(AdmissionConfig(name, min_reuse=2) for name in tier_names)
        found.append(Policy("tiers min_reuse 2", tiers))
    return found


@dataclass
class AdmissionSweep:
    """The model, capacities, the policies, and one result per (N, policy)."""

    options: AdmissionOptions
    identity: CacheIdentity
    capacities: dict[str, Any]
    policies: list[Policy]
    results: list[RunResult]


class AdmissionBench:
    """Builds the model once (through ``Bench``), then runs every policy at each N.

    ``bench``: a ``Bench`` already built on the same model options (else one is built); only
    its model, identity, tiers and capacities are used, never its ``conversations``.
    """

    def __init__(self, options: AdmissionOptions, bench: Bench | None = None) -> None:
        self.options = options
        self.bench = bench or Bench(options.bench)
        self.identity = self.bench.identity

    def capacities(self) -> dict[str, Any]:
        caps = self.bench.capacities()
        slots = TieringConfig.from_dict({"cpu_bytes_to_use": caps["host_bytes"]}).host_slots(
            caps["chunk_bytes"]
        )
        window = self.options.frequency_window or 8 * slots
        one_shot = self.options.spec(1, self.bench.vocab_size).one_shot_tokens
        return {
            **caps,
            "host_chunks": slots,
            "frequency_window": window,
            "one_shot_chunks": one_shot // caps["chunk_tokens"],
        }

    def policies(self) -> list[Policy]:
        names = self._tier_names()
        return policies(names, self.capacities()["frequency_window"])

    def _tier_names(self) -> list[str]:
        """The secondary tiers' names (``name``, else the type), as admission levels."""
        if self.bench.tiering is None:
            return []
        return [_tier_label(tier) for tier in self.bench.tiering.secondary_tiers]

    def strategies(self) -> list[Strategy]:
        """One strategy per policy: the base tiers (``--config``, else host memory alone) with
        the policy's admission in place of the base's own."""
        caps = self.capacities()
        base = self.bench.tiering or TieringConfig.from_dict(
            {"cpu_bytes_to_use": caps["host_bytes"]}
        )
        return [
            Strategy(
                policy.name,
                caps["device_chunks"],
                dataclasses.replace(base, admission=policy.admission, store_threshold=None),
            )
            for policy in self.policies()
        ]

    def start(self, strategy: Strategy, spec: MixedSpec) -> StrategyRun:
        bench = self.bench
        bench._runs += 1
        return StrategyRun(
            bench.model,
            self.identity,
            strategy,
            spec.conversations,
            f"bench-admission-{bench._runs}",
            MixedWorkload(spec),
        )

    def warm_up(self) -> None:
        """Every policy serves one conversation and a one-shot per round (the first call at a
        new prompt length is much slower)."""
        options = dataclasses.replace(self.options, one_shots_per_round=1)
        self._side_by_side(options.spec(1, self.bench.vocab_size), None)

    def sweep(self, progress: Any = None) -> AdmissionSweep:
        """Every policy at each N; ``progress`` (a tqdm-like bar) ticks once per request."""
        results: list[RunResult] = []
        for num_conversations in self.options.bench.conversations:
            if progress is not None:
                progress.set_description(f"{num_conversations} conversations")
            spec = self.options.spec(num_conversations, self.bench.vocab_size)
            results += self._side_by_side(spec, progress)
        return AdmissionSweep(
            self.options, self.identity, self.capacities(), self.policies(), results
        )

    def _side_by_side(self, spec: MixedSpec, progress: Any) -> list[RunResult]:
        """All policies on one workload, taking turns request by request."""
        starts = [lambda s=strategy: self.start(s, spec) for strategy in self.strategies()]
        return take_turns(starts, progress)

    def num_requests(self) -> int:
        vocab = self.bench.vocab_size
        per_policy = sum(
            self.options.spec(n, vocab).num_requests for n in self.options.bench.conversations
        )
        return per_policy * len(self.policies())
