"""Accelerate's README loop, unchanged but for the one line a CPU machine needs, launched with a preset's YAML:

    accelerate launch --config_file $(hf-zero presets zero3 --accelerate-config zero3.yaml) \
        accelerate_readme_loop.py --model M --out O

Only Accelerate's documented API trains and saves. Rank 0 writes result.json (losses, the engine's optimizer and
config) and the engine's gathered weights (expected.safetensors) next to the saved model.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DummyOptim
from transformers import AutoModelForCausalLM

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero

if "--plain" not in sys.argv:  # the README loop as it stands, with no hf_zero line (on GPUs it runs so)
    Accelerator = hf_zero.accelerator  # noqa: F811  (the one-line CPU glue; on GPUs the script runs without it)


def gathered_first_losses(accelerator, first: float) -> list:
    """Each rank's first loss, as every rank sees it (a collective)."""
    return accelerator.gather(torch.tensor([first], device=accelerator.device)).tolist()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--optimizer", choices=["torch", "dummy"], default="torch")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--plain", action="store_true", help="accelerate.Accelerator, without hf_zero.accelerator()")
    opts = p.parse_args()

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (4, 16), generator=g).repeat(opts.steps * accelerator.num_processes, 1)
    data = torch.utils.data.DataLoader([{"input_ids": i, "labels": i.clone()} for i in ids], batch_size=2)
    if opts.optimizer == "torch":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-6)
    else:
        optimizer = DummyOptim(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-6)

    model, optimizer, data = accelerator.prepare(model, optimizer, data)

    losses, mine = [], []
    model.train()
    for step, batch in enumerate(data):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), reduction="mean").item())
        mine.append(loss.item())
        if step + 1 == opts.steps:
            break

    out = Path(opts.out)
    expected = hf_zero.gathered_state_dict(accelerator.unwrap_model(model))  # the test's reference; a collective
    state_dict = accelerator.get_state_dict(model)
    accelerator.unwrap_model(model).save_pretrained(out / "final", state_dict=state_dict,
                                                    is_main_process=accelerator.is_main_process,
                                                    save_function=accelerator.save)
    first_losses = [round(x, 6) for x in gathered_first_losses(accelerator, mine[0])]
    if accelerator.is_main_process:
        from safetensors.torch import save_file

        save_file(expected, str(out / "expected.safetensors"))
        basic = model.optimizer.optimizer  # the torch optimizer inside DeepSpeed's ZeRO optimizer
        zero = model._config.zero_config.model_dump(by_alias=True, mode="json")
        result = {"losses": losses, "engine": type(model).__name__, "dp_world_size": model.dp_world_size,
                  "zero_stage": model.zero_optimization_stage(), "optimizer": type(basic).__name__,
                  "betas": list(basic.param_groups[0]["betas"]), "eps": basic.param_groups[0]["eps"],
                  "zero_config": zero, "sequence_parallel_size": getattr(model, "sequence_parallel_size", 1),
                  "losses_per_rank": first_losses}
        (out / "result.json").write_text(json.dumps(result, indent=1))
    accelerator.wait_for_everyone()
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)


if __name__ == "__main__":
    main()
