"""The Accelerate door, hf_zero in a user's own Accelerate loop: an Accelerator DeepSpeed really drives, the "auto"
values only the Trainer fills, the checks ZeroCallback runs for the Trainer (hf_zero.checks), and a save that
reloads with ``from_pretrained``.

    # accelerate launch --config_file zero3.yaml (written by: hf-zero presets zero3 --accelerate-config zero3.yaml)
    accelerator = hf_zero.accelerator()
    model = AutoModelForCausalLM.from_pretrained(path)   # partitioned by zero.Init under ZeRO-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)   # or DummyOptim(...) for DeepSpeed's AdamW
    model, optimizer, loader = hf_zero.prepare(accelerator, model, optimizer, loader)
    ...  # the loop: accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
    hf_zero.save_pretrained(accelerator, model, "out/final", tokenizer)   # every rank calls it
"""

from .optimizers import deepspeed_adamw_for
from .prepare import accelerator, prepare
from .runs import run_of
from .save import save_pretrained

__all__ = ["accelerator", "deepspeed_adamw_for", "prepare", "run_of", "save_pretrained"]
