"""``python -m tpunb ...``: tpunb from a terminal, beside a busy notebook (see tpunb.hangs.cli)."""
from tpunb.hangs.cli import main

raise SystemExit(main())
