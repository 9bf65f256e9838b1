"""``python -m tpunb ...``: tpunb from a terminal, beside a busy notebook (see tpunb.server.stacks_cli)."""
from tpunb.server.stacks_cli import main

raise SystemExit(main())
