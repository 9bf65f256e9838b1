"""``python -m tpunb ...``: tpunb from a terminal, beside a busy notebook (see tpunb.stuck.cli)."""
from tpunb.stuck.cli import main

raise SystemExit(main())
