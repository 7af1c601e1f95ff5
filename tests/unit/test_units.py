"""The one byte formatter, in both the styles its callers print."""

from dlc.units import GIB, KIB, MIB, TIB, format_bytes


def test_sizes_in_messages_group_thousands_and_go_to_powers_of_ten_beyond_the_largest_unit():
    assert format_bytes(1.5 * GIB) == "1.5 GiB"
    assert format_bytes(1000 * MIB) == "1,000.0 MiB"  # under a GiB: still MiB
    assert format_bytes(512) == "0.5 KiB"  # KiB is the smallest unit here
    assert format_bytes(2 * TIB) == "2.0 TiB"
    assert format_bytes(2.1e6 * TIB) == "2.1e+06 TiB"  # a thousand TiB and more: no larger unit


def test_meters_stop_at_gib_and_count_whole_bytes():
    meter = {"largest": "GiB", "smallest": "B", "grouped": False}
    assert format_bytes(1500 * GIB, 2, **meter) == "1500.00 GiB"  # no TiB, no separator
    assert format_bytes(3 * KIB, 1, **meter) == "3.0 KiB"
    assert format_bytes(512, 2, **meter) == "512 B"
    assert format_bytes(-2 * MIB, 2, **meter) == "-2.00 MiB"  # a unit by magnitude
    assert format_bytes(None, 2, **meter) == "-"  # nothing measured yet
