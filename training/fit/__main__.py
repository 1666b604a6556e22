"""`python -m training.fit`: see `training.fit.cli`."""

from training.fit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
