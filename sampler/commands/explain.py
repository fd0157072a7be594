"""``python -m sampler explain STORE``: where a run went slow, and why.

Finds the stretches whose throughput (steps per second on the step axis) fell well below the
run's typical (its median), and for each says, strongest first, what the recorded signals show
was different from the run's typical at the same time: what the training loop was doing (waiting
for its input, computing, waiting in the collective, idle or sleeping), CPU, memory or I/O
pressure, the process tree on every CPU it may use, the backend at one full core, memory near a
container limit, GPU throttling or waiting; a cause that held for part of a stretch, with the
share it held. A pause of the step (an evaluation, a checkpoint) is named as such, and a stretch
with no evidence says so. For a rank of a multi-rank launch (or with ``--launch``), it
also compares each rank's throughput with the launch's median and names the ranks that fell
behind, where, and what their signals showed against the other ranks then; where the ranks
timed their steps' phases (``watch_model``), the rank that held the others back in synchronous
training, the phase it spent longer in (input or compute), what its signals showed against the
other ranks then, and how the others' wait in the collective grew (``sampler.analysis.ranks``).
``--json`` for machines; ``plot --explain`` shades the same stretches.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sqlite3
import sys
from typing import Any, TextIO

from sampler.analysis import ranks, stretches
from sampler.analysis.evidence import Reason
from sampler.analysis.explain import Explanation, explain
from sampler.commands.common import DEFAULT_STORE, EXIT_USAGE, argument, open_store
from sampler.commands.stalls import explain_json, explain_line, read_stalls
from sampler.settings.parsers import Invalid
from sampler.store.reader import Launch, StoreReader, launches
from sampler.util.quoting import printable
from sampler.views.formatting import format_duration


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise Invalid("expected a number between 0 and 1") from None
    if not 0 < value < 1:
        raise Invalid("expected a number between 0 and 1")
    return value


def _run_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) <= 0:
        raise Invalid("run ids are whole numbers from 1")
    return int(text)


def add_parser(commands: Any) -> None:
    """Register ``explain`` with the ``add_subparsers()`` object ``commands``."""
    parser = commands.add_parser(
        "explain",
        help="say where a run went slow, and what the signals show was different then",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    parser.add_argument("store", nargs="?", default=DEFAULT_STORE, metavar="STORE", help="the run store")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--run", type=argument(_run_id), metavar="ID", help="the run (default: the newest)")
    which.add_argument(
        "--launch",
        metavar="ID",
        help="compare the ranks of this multi-rank launch (its id, or a unique start of it) alone",
    )
    parser.add_argument(
        "--slow",
        type=argument(_fraction),
        default=stretches.SLOW_FRACTION,
        metavar="SHARE",
        help="a window below this share of the typical throughput is slow "
        f"(default {stretches.SLOW_FRACTION})",
    )
    parser.add_argument("--json", action="store_true", help="print the stretches as JSON")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    out: TextIO = getattr(args, "out", None) or sys.stdout
    reader = open_store(args.store)
    if reader is None:
        return EXIT_USAGE
    with reader:
        try:
            explanation, comparison = _explain(reader, args)
            stalled = [] if explanation is None else read_stalls(reader.db, explanation.run.id) or []
        except LookupError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except sqlite3.Error as exc:
            print(f"error: {args.store} cannot be read as a run store: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if args.json:
        found = explanation.as_json() if explanation is not None else {}
        if explanation is not None:
            found["stalls"] = [explain_json(stall) for stall in stalled]
        if comparison is not None:
            found["launch"] = comparison.as_json()
        json.dump(found, out, indent=2)
        out.write("\n")
        return 0
    if explanation is not None:
        out.write(render(explanation))
    out.writelines(explain_line(stall) + "\n" for stall in stalled)
    if comparison is not None:
        out.write(render_launch(comparison))
    return 0


def _explain(
    reader: StoreReader, args: argparse.Namespace
) -> tuple[Explanation | None, ranks.Comparison | None]:
    """The run's explanation (none with ``--launch``) and its launch's comparison (none for a
    run alone); ``LookupError`` for a run or launch that is not there, or a launch of one rank."""
    if args.launch is not None:
        launch = ranks.several(reader, args.launch, "explain")
        return None, ranks.compare(ranks.gather(reader, launch), args.slow)
    run = reader.run(args.run)
    explanation = explain(reader, run, args.slow)
    its_launch = next(
        (item for item in launches(reader.runs()) if isinstance(item, Launch) and run in item.runs), None
    )
    if its_launch is None or its_launch.ranks < 2:  # a run alone, or the store holds no other rank
        return explanation, None
    return explanation, ranks.compare(ranks.gather(reader, its_launch), args.slow)


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else format_duration(seconds)


def _clock(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall).strftime("%H:%M:%S")


def render(explanation: Explanation) -> str:
    """The explanation as the lines ``explain`` prints."""
    run = explanation.run
    head = f"run {run.id} ({run.where}): {explanation.records} records"
    if explanation.typical != explanation.typical:
        return head + "; too few to tell a throughput from.\n"
    lines = [f"{head}, typically {explanation.typical:.3g} steps/s."]
    if not explanation.stretches:
        lines.append("No stretch ran well below that, and the step never stood still.")
    for item in explanation.stretches:
        s = item.stretch
        when = (
            f"steps {s.start_step:,}-{s.end_step:,} "
            f"({_clock(s.start_wall)}-{_clock(s.end_wall)}, {_duration(s.seconds)})"
        )
        if s.kind == stretches.STARTUP:
            lines.append(
                f"{when}: the run's start-up (imports, building the model, the first batches, "
                "compilation) before its steady pace, not a slowdown."
            )
            continue
        if s.kind == stretches.PAUSE and not item.reasons:
            lines.append(
                f"{when}: the step stood still for {_duration(s.still_seconds)} "
                "(an evaluation or a checkpoint, not a slowdown)."
            )
            continue
        if s.kind == stretches.PAUSE:
            lines.append(f"{when}: the step stood still for {_duration(s.still_seconds)}.")
            lines.extend(_reason_lines(item.reasons))
            continue
        share = s.throughput / explanation.typical
        lines.append(f"{when}: {s.throughput:.3g} steps/s, {share:.0%} of typical.")
        if not item.reasons:
            lines.append("  no evidence: nothing recorded was different from the run's typical then.")
        lines.extend(_reason_lines(item.reasons))
    return "\n".join(lines) + "\n"


def _reason_lines(reasons: list[Reason]) -> list[str]:
    """Numbered, each with the signals it cites."""
    return [
        f"  {number}. {reason.text} [{', '.join(e.signal for e in reason.evidence)}]"
        for number, reason in enumerate(reasons, 1)
    ]


def render_launch(comparison: ranks.Comparison) -> str:
    """The comparison of a launch's ranks as the lines ``explain`` prints."""
    gathered = comparison.ranks
    launch = gathered.launch
    head = f"launch {printable(launch.id)} ({launch.held})"
    silent = "".join(
        f"\n  run {run.id} (rank {run.rank}) has no records to compare." for run in gathered.silent
    )
    if len(gathered.ranks) < 2:
        return f"{head}: fewer than two of its ranks have records to compare.{silent}\n"
    each = ", ".join(f"{rank.label} {rank.typical:.3g}" for rank in gathered.ranks)
    lines = [f"{head}: steps/s typically {each}.{silent}"]
    if not comparison.lags:
        lines.append("No rank fell well behind the ranks' median.")
    for lag in comparison.lags:
        lines.append(
            f"{lag.rank.named} lagged over steps {lag.start_step:,}-{lag.end_step:,}"
            f" ({_clock(lag.start_wall)}-{_clock(lag.end_wall)}, {_duration(lag.seconds)}):"
            f" {lag.throughput:.3g} steps/s against the ranks' median {lag.median:.3g},"
            f" {lag.behind:.3g} steps/s ({lag.share_behind:.0%}) behind."
        )
        if not lag.reasons:
            lines.append(
                f"  no evidence: nothing {lag.rank.label} recorded was different from the other ranks then."
            )
        else:  # the rules' "typically" is, here, the other ranks at the same time
            lines.append("  against the other ranks then:")
        for number, reason in enumerate(lag.reasons, 1):
            cited = ", ".join(e.signal for e in reason.evidence)
            lines.append(f"  {number}. {reason.text} [{cited}]")
    lines.extend(_stop_line(stop) for stop in comparison.stops)
    if comparison.untimed:
        which = ", ".join(rank.named for rank in comparison.untimed)
        lines.append(
            f"Untimed: {which} recorded no step phases (no sampler.watch_model(module) there): whether"
            " it held the others back cannot be told."
        )
    if comparison.timed and not comparison.culprits and not comparison.fleeting:
        agree = "No timed rank" if comparison.untimed else "No rank"
        lines.append(f"{agree} held the others back: the ranks' step phases agree.")
    lines.extend(_culprit_lines(culprit) for culprit in comparison.culprits)
    if comparison.fleeting:
        each = ", ".join(f"{rank.named} {_duration(seconds)}" for rank, seconds in comparison.fleeting)
        moved = "moved between ranks" if len(comparison.fleeting) > 1 else "came and went"
        lines.append(
            f"Fleeting: for {_duration(comparison.fleeting_seconds)} in all a rank held the others back"
            f" in spells too short to name one ({each}): the hold {moved}, no one rank's for long."
        )
    return "\n".join(lines) + "\n"


def _stop_line(stop: ranks.Stop) -> str:
    """What ``explain`` says of a rank that stopped while another stood further along."""
    until = (
        f"for {_duration(stop.end_wall - stop.start_wall)}"
        if stop.end_wall is not None
        else "to its records' end"
    )
    if stop.silent:
        until += "; its monitor wrote nothing more: the process died, or hung holding the interpreter"
    others = (
        "the others went on past it"
        if stop.others_went_on
        else "the others stood still too, waiting for it at the collective"
    )
    return (
        f"Stuck: {stop.rank.named} stopped at step {stop.step:,} ({_clock(stop.start_wall)}, {until}) while"
        f" another rank stood at step {stop.others_step:,}: {others}."
    )


def _value(value: float, unit: str) -> str:
    return f"{value:.0f}%" if unit == "%" else f"{value:.3g} {unit}"


_PHASE_WORDS = {ranks.INPUT: "its input", ranks.FORWARD: "its compute (the forward pass)"}


def _culprit_lines(culprit: ranks.Culprit) -> str:
    """What ``explain`` says of one rank that held the others back."""
    own, others = culprit.shares, culprit.others
    typical = culprit.others_typical_backward
    grew = f" (typically {typical:.0f}%)" if typical == typical else ""
    lines = [
        f"{culprit.rank.named} held the others back in"
        f" {_PHASE_WORDS[culprit.phase]} over steps {culprit.start_step:,}-{culprit.end_step:,}"
        f" ({_clock(culprit.start_wall)}-{_clock(culprit.end_wall)}, {_duration(culprit.seconds)}):"
        f" of each {culprit.step_seconds:.3g} s step it spent {own[ranks.INPUT]:.0f}% waiting for input"
        f" and {own[ranks.FORWARD]:.0f}% in forward (the other ranks {others[ranks.INPUT]:.0f}% and"
        f" {others[ranks.FORWARD]:.0f}%), and {own[ranks.BACKWARD]:.0f}% in backward, while the other"
        f" ranks' backward, their wait for it in the gradients' collective, grew to"
        f" {others[ranks.BACKWARD]:.0f}%{grew}."
    ]
    if culprit.machine:
        shown = "; ".join(
            f"{reading.title} {_value(reading.own, reading.unit)} ({_value(reading.others, reading.unit)})"
            for reading in culprit.machine
        )
        lines.append(f"  its machine then (the other ranks' in brackets): {shown}.")
    if not culprit.reasons:
        lines.append(f"  nothing else {culprit.rank.label} recorded was different from the other ranks then.")
    else:
        lines.append(f"  {culprit.rank.label}'s machine against the other ranks then:")
    for number, reason in enumerate(culprit.reasons, 1):
        cited = ", ".join(e.signal for e in reason.evidence)
        lines.append(f"  {number}. {reason.text} [{cited}]")
    return "\n".join(lines)
