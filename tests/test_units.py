"""The one duration parser and the one byte formatter every flag, notice and view uses."""
from __future__ import annotations

import re

import pytest

from tpunb.errors import UsageError
from tpunb.units import format_bytes, parse_duration


@pytest.mark.parametrize("n, text", [(0, "0 bytes"), (1023, "1023 bytes"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
                                     (1 << 20, "1.0 MiB"), (27_838_000, "26.5 MiB"), (3 * 2**30, "3.0 GiB"),
                                     (5 * 2**40, "5.0 TiB"), (2**50, "1024.0 TiB")])
def test_bytes_are_said_in_binary_units(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("30min", 1800), ("2h", 7200), ("1d", 86400),
                                           ("2w", 1209600), ("1h30m", 5400), ("1.5h", 5400), (" 2 h ", 7200),
                                           (45, 45), (2.5, 2.5), ("0", 0)])
def test_durations_read_with_their_units(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["36", "off", None, "2y", "h", -5, float("inf"), True])
def test_a_duration_without_a_unit_is_refused_naming_the_units(bad):
    with pytest.raises(UsageError, match=r"^--deadline takes a duration with a unit, not .*: use 90s, 30m, 2h or 1d$"):
        parse_duration(bad, "--deadline")


def test_off_is_only_a_duration_where_the_flag_allows_it():
    assert [parse_duration(v, off=True) for v in ("off", "never", None, 0)] == [0, 0, 0, 0]
    with pytest.raises(UsageError, match=r"\(0 or off: never\)$"):
        parse_duration("soon", "--idle-delete", off=True)


def test_the_copy_progress_bar_says_binary_rates(capsys):
    from tpunb.widgets.copy_progress import byte_progress

    with byte_progress("sync") as update:
        update(3 * 2**20, 3 * 2**20)
    bar = capsys.readouterr().err
    assert "3.00M/3.00M" in bar and "iB/s" in bar and not re.search(r"[kMGT]B/s", bar), bar
