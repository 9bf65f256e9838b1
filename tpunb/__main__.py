"""``python -m tpunb ...``: tpunb from a terminal, beside a busy notebook (see tpunb.doctor.cli)."""
from tpunb.doctor.cli import main

raise SystemExit(main())
