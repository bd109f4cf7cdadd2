"""``python -m kvstab.cli …``: the same as ``kvstab …``."""

from kvstab.cli import main

raise SystemExit(main())
