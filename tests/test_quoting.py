"""``sampler.util.quoting.printable``: store text shown on a terminal without driving it."""

from __future__ import annotations

import pytest

from sampler.util.quoting import printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # C0: ESC, a screen clear
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x00\x07\x7f", "\\x00\\x07\\x7f"),  # NUL, BEL, DEL
        ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1: CSI, NEL
        ("abc\u202egpj.exe", "abc\\u202egpj.exe"),  # bidi override
        ("x\u200by\ufeff", "x\\u200by\\ufeff"),  # zero-width space, BOM: format characters
        ("\U000e0001", "\\U000e0001"),  # a tag character, beyond the BMP
        ("node-7 rank 1/2", "node-7 rank 1/2"),
        ("héllo 日本 ✓ ▁█", "héllo 日本 ✓ ▁█"),  # printable text is shown as is
        ("", ""),
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(shown) == shown  # escaping twice changes nothing more
