"""The recording and alerting rules shipped for a site's Prometheus (``rules.yml`` beside this module).

The file is the one source: ``python -m sampler prometheus rules`` prints it as it is,
thresholds and comments included, for a site to keep and change.
"""

from __future__ import annotations

from importlib import resources

FILE_NAME = "rules.yml"


def text() -> str:
    """The rules file, as shipped."""
    return resources.files(__package__).joinpath(FILE_NAME).read_text(encoding="utf-8")
