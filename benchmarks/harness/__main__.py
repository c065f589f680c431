"""python -m benchmarks.harness (from an hf_zero checkout): see cli.py."""

from .cli import main

raise SystemExit(main())
