"""`python -m training.collect`: see `training.collect.cli`."""

from training.collect.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
