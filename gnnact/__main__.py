"""``python -m gnnact``: the ``gnnact`` command line (see :mod:`gnnact.cli`)."""

from gnnact.cli import main

raise SystemExit(main())
