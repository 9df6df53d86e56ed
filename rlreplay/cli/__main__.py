"""``python -m rlreplay.cli``: the ``rlreplay`` command."""

from rlreplay.cli import main

raise SystemExit(main())
