"""Byte sizes as people read them: the binary units, and the one formatter every message and view uses."""

from __future__ import annotations

from typing import Literal

KIB, MIB, GIB, TIB = 2**10, 2**20, 2**30, 2**40

Unit = Literal["TiB", "GiB", "MiB", "KiB", "B"]
UNITS: tuple[tuple[Unit, int], ...] = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB), ("B", 1))


def format_bytes(
    n: float | None, digits: int = 1, *, largest: Unit = "TiB", smallest: Unit = "KiB", grouped: bool = True
) -> str:
    """`n` bytes in the largest unit it reaches, between `largest` and `smallest`: 1.5 * 2**30 -> '1.5 GiB'.

    The defaults suit sizes quoted in messages (the memory checks): down to KiB ('0.5 KiB'),
    thousands grouped ('1,000.0 MiB'), and beyond a thousand TiB, the largest unit there is, in
    powers of ten ('2.1e+06 TiB'). A meter that stops at a smaller unit keeps counting in it
    (`dlc status`: largest="GiB", smallest="B", grouped=False gives '1500.00 GiB' and '512 B').
    Whole bytes have no decimals. None (nothing measured yet) is '-'.
    """
    if n is None:
        return "-"
    names = [name for name, _ in UNITS]
    ladder = UNITS[names.index(largest) : names.index(smallest) + 1]
    if ladder[0][0] == UNITS[0][0] and abs(n) >= 1000 * ladder[0][1]:
        return f"{n / ladder[0][1]:.2g} {ladder[0][0]}"
    comma = "," if grouped else ""
    # The smallest unit takes whatever is below the others, however small.
    unit, scale = next(((u, s) for u, s in ladder[:-1] if abs(n) >= s), ladder[-1])
    places = 0 if unit == "B" else digits
    return f"{n / scale:{comma}.{places}f} {unit}"
