"""`python -m controllers.node_power`: see `cli` (`--help`)."""

from controllers.node_power.cli import main

raise SystemExit(main())
