"""What users run: ``python -m sampler COMMAND``, one module per command.

Each command module has ``add_parser(commands)``, which registers its
subcommand with a ``handler(args) -> exit status``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from sampler.commands import (
    config,
    demo,
    explain,
    export,
    plot,
    postmortem,
    prometheus,
    run,
    runs,
    stalls,
    top,
)
from sampler.commands.common import EXIT_BROKEN_PIPE, EXIT_USAGE, silence

COMMANDS = (demo, run, top, plot, explain, runs, stalls, export, config, postmortem, prometheus)


SCRIPT = "wl-resource-monitor"
"""The command ``pip install`` puts on the PATH (``[project.scripts]`` in pyproject.toml)."""


def program() -> str:
    """The command as the user typed it: the installed script (``wl-resource-monitor``), else
    ``python -m sampler``."""
    return SCRIPT if sys.argv and os.path.basename(sys.argv[0]) == SCRIPT else "python -m sampler"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program(), description="Resource monitoring for ML training backends."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``python -m sampler``; returns the exit status. ``out``: where results go (stdout)."""
    out = out or sys.stdout
    if out is None:  # started with its standard output closed (`... >&-`): Python gives None
        if sys.stderr is not None:
            print("error: standard output is closed; give it somewhere to go (> FILE)", file=sys.stderr)
        return EXIT_USAGE
    args = _parser().parse_args(argv)
    args.out = out
    try:
        status: int = args.handler(args)
    except BrokenPipeError:  # `... | head`: end quietly, as a Unix tool killed by SIGPIPE would
        silence(args.out)
        return EXIT_BROKEN_PIPE
    return status
