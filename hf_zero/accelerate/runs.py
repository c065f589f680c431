"""The run each Accelerator with a DeepSpeed plugin drives, as hf_zero.checks sees it."""

import weakref

from ..checks import CHECKS, RunContext, raise_errors, run_moment

# Accelerator -> the RunContext hf_zero.checks reads and records for its run (run.ran: every check, per moment)
RUNS = weakref.WeakKeyDictionary()
# Accelerators from hf_zero.accelerator() on several ranks: their saves first find out that every rank called them
WAITS_FOR_RANKS = weakref.WeakSet()


def run_of(accelerator, skip_checks=()) -> RunContext:
    """The run an Accelerator with a DeepSpeed plugin drives, as hf_zero.checks sees it; the config checks run (and
    fix the live config) the first time it is asked for."""
    from accelerate.utils import DynamoBackend

    run = RUNS.get(accelerator)
    if run is None:
        run = RunContext("accelerate", accelerator.state.deepspeed_plugin.deepspeed_config,
                         skip=frozenset(skip_checks), accelerator=accelerator,
                         compiled=accelerator.state.dynamo_plugin.backend != DynamoBackend.NO)
        raise_errors(run_moment(CHECKS, "config", run))
        RUNS[accelerator] = run
    return run
