"""One run explained: its typical throughput, its slow stretches and pauses, and their reasons."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sampler.analysis import evidence, stretches, timeline
from sampler.analysis.evidence import Reason
from sampler.analysis.stretches import Stretch
from sampler.store.reader import Run, StoreReader


@dataclass(frozen=True)
class Explained:
    """One stretch and what explains it."""

    stretch: Stretch
    reasons: list[Reason]
    """Strongest first; empty for the start-up, a pause the step's phases do not tell (an
    evaluation, a checkpoint), and a slow stretch nothing stood out in."""


@dataclass(frozen=True)
class Explanation:
    run: Run
    records: int
    typical: float
    """The run's typical throughput, steps/s (NaN with fewer than two records)."""
    stretches: list[Explained]

    def as_json(self) -> dict[str, Any]:
        """The explanation as plain JSON types."""
        return {
            "run": self.run.id,
            "host": self.run.host,
            "records": self.records,
            "typical_steps_per_second": json_number(self.typical),
            "stretches": [
                {
                    "kind": e.stretch.kind,
                    "first_step": e.stretch.start_step,
                    "last_step": e.stretch.end_step,
                    "start": e.stretch.start_wall,
                    "end": e.stretch.end_wall,
                    "seconds": e.stretch.seconds,
                    "steps_per_second": json_number(e.stretch.throughput),
                    "share_of_typical": json_number(e.stretch.throughput / self.typical),
                    "still_seconds": e.stretch.still_seconds,
                    "reasons": [asdict(reason) for reason in e.reasons],
                }
                for e in self.stretches
            ],
        }


def json_number(value: float) -> float | None:
    """``value``, or None (JSON's null) for NaN."""
    return value if value == value else None


def explain(reader: StoreReader, run: Run, slow_fraction: float = stretches.SLOW_FRACTION) -> Explanation:
    """Find ``run``'s slow stretches and pauses and what the signals say of each."""
    records = timeline.load(reader, run)
    findings = stretches.find(records, slow_fraction)
    launched = run.world_size > 1
    baseline = evidence.Baseline(records, findings.regular)  # read once, shared by every stretch
    pauses = [s for s in findings.stretches if s.kind == stretches.PAUSE]
    paused = dict(zip(map(id, pauses), evidence.pause_reasons(pauses, baseline), strict=True))
    explained = [
        Explained(
            s,
            evidence.reasons(records, findings, s, launched, baseline)
            if s.kind == stretches.SLOW
            else paused.get(id(s), []),
        )
        for s in findings.stretches
    ]
    return Explanation(run, len(records), findings.typical, explained)
