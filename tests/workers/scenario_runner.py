"""What the one-process scenario workers (attach_checks.py, prepare_checks.py) share: a fresh Accelerate state per
scenario, and a main that runs every scenario and writes OUT/<name>.json, even when one crashes."""

import argparse
import json
import traceback
from pathlib import Path

import hf_zero


def reset_accelerate():
    """Each scenario builds its own Accelerator with its own DeepSpeed plugin."""
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()  # noqa: the process group itself stays up
    unset_hf_deepspeed_config()


def main(scenarios, results_name: str) -> None:
    """``scenarios(model_path, out)`` yields (name, result) pairs; they go to OUT/``results_name``."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    opts = p.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    hf_zero.init_distributed()
    results = {}
    try:
        for name, result in scenarios(opts.model, out):
            results[name] = result
    except Exception:
        results["crashed"] = traceback.format_exc()
        raise
    finally:
        (out / results_name).write_text(json.dumps(results, indent=1))
        hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)
