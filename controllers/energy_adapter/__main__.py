"""`python -m controllers.energy_adapter --prometheus URL`: see `cli` (`--help`)."""

from controllers.energy_adapter.cli import main

raise SystemExit(main())
