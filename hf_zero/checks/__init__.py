"""The checks both front doors run (ZeroCallback for the Trainer, hf_zero.prepare for an Accelerate loop): one list,
each entry (a check, a fix or a guard) with an id, a moment, a severity and a way to turn it off (docs/run-checks.md);
the options both doors take (ZeroOptions)."""

from .catalog import CHECK_IDS, CHECKS, LONG_CONTEXT, PLANNED, SKIP_IDS
from .context import DOORS, RunContext
from .options import ZeroOptions, check_options, option_problems
from .pipeline import MOMENT_MEANING, MOMENTS, Check, raise_errors, run_moment, skip_problem

__all__ = ["Check", "CHECK_IDS", "CHECKS", "check_options", "DOORS", "LONG_CONTEXT", "MOMENT_MEANING", "MOMENTS",
           "option_problems", "PLANNED", "raise_errors", "run_moment", "RunContext", "SKIP_IDS", "skip_problem",
           "ZeroOptions"]
