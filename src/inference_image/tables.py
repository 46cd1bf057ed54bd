"""The command line's plain-text tables, laid out by tabulate: columns two spaces apart, no
trailing blanks, every cell text as given (a version or an address is never read as a number)."""

from __future__ import annotations

from collections.abc import Sequence

import tabulate as _tabulate
from tabulate import tabulate

# a header as wide as its text, as the rows' cells are (tabulate pads headers by 2 by default)
_tabulate.MIN_PADDING = 0


def text_table(rows: Sequence[Sequence[object]], *, rule: bool = False, indent: str = "",
               align: str = "") -> str:
    """`rows` (the first is the header) as aligned columns; `rule` puts a dashed line under the
    header, `align` aligns column by column ("r" right, "l" left: "lrrr"; left where it does not
    reach), `indent` starts every line."""
    head, body = [str(c) for c in rows[0]], [[str(c) for c in r] for r in rows[1:]]
    cols = ["right" if align[i:i + 1] == "r" else "left" for i in range(len(head))]
    out = tabulate(body, headers=head, tablefmt="simple" if rule else "plain",
                   disable_numparse=True, colalign=cols)
    return "\n".join(indent + line.rstrip() for line in out.split("\n"))
