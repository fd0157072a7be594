"""``python -m sampler prometheus rules``: the rules a site's Prometheus loads, on stdout.

Recording rules for each rank's steps per second and each launch's median and spread;
alerts for a stuck rank, a straggler, a rank whose endpoint is down, children restarting,
memory near the container's limit, a disk near full and a throttled GPU.
"""

from __future__ import annotations

import argparse
from typing import Any

from sampler.prometheus import rules


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "prometheus", help="what a Prometheus server needs from this package", description=__doc__
    )
    things = parser.add_subparsers(dest="what", metavar="WHAT", required=True)
    printer = things.add_parser(
        "rules",
        help="print the recording and alerting rules (YAML for rule_files:)",
        description="Print the rules file; its thresholds are documented defaults to change in it.",
    )
    printer.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    args.out.write(rules.text())
    return 0
