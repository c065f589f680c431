"""Which ZeRO-3 leaf modules train (DeepSpeed's engine and the zero3 preset, no hf_zero), on CPU processes (gloo).

A tiny Llama trains 8 AdamW steps (lr 1e-2) on two alternating batches under the zero3 preset, with the persistence,
live and reuse limits at 0 so every weight is partitioned and gathered. Leaves:

- ``none``: no leaf modules (the reference);
- ``layers``: the decoder layers (``set_z3_leaf_modules``), which return a tensor;
- ``base_model``: the inner LlamaModel, which returns BaseModelOutputWithPast;
- ``whole_model``: LlamaForCausalLM itself, which returns CausalLMOutputWithPast;
- ``threshold``: the preset's ``stage3_module_granularity_threshold`` (5e6), which makes this model one leaf.

DeepSpeed reduces a leaf's gradients in a module backward hook; torch calls it only for a Tensor or tuple output. Where
it is never called, the gradients stay on the parameters, and the step's ``zero_grad`` calls ``record_stream`` on them,
which CPU tensors lack ("unknown parameter type"); a GPU tensor has it, so on a GPU the run goes on. The probe makes
``record_stream`` a no-op (what it is for CPU tensors' purposes) so the CPU run goes on as a GPU run does, and records
the losses: the run trains, or its loss only moves by weight decay.

    python benchmarks/cpu/leaf_modules/probe.py  # writes results.json beside it
"""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
PRESET = HERE.parents[3] / "recipes" / "zero3.json"
MODES = ("none", "layers", "base_model", "whole_model", "threshold")


def train(mode: str) -> dict:
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.Tensor.record_stream = lambda self, stream: None  # see the docstring: as a GPU tensor's call goes through
    deepspeed.init_distributed("gloo")
    config = json.loads(PRESET.read_text())
    zero = config["zero_optimization"]
    zero["stage3_module_granularity_threshold"] = 5_000_000 if mode == "threshold" else 0
    for key in ("stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance"):
        zero[key] = 0
    config.update(bf16={"enabled": False}, fp16={"enabled": False}, train_micro_batch_size_per_gpu=2,
                  gradient_accumulation_steps=1, gradient_clipping=1.0)
    config.pop("train_batch_size")
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=4, vocab_size=256))
    leaf_class = {"layers": type(model.model.layers[0]), "base_model": type(model.model),
                  "whole_model": type(model)}.get(mode)
    if leaf_class is not None:
        deepspeed.utils.set_z3_leaf_modules(model, [leaf_class])
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                      config=config)
    leaves = [name or "(the model)" for name, m in engine.module.named_modules() if deepspeed.utils.z3_leaf_module(m)]
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (2, 32), generator=generator) for _ in range(2)]
    losses = []
    for step in range(8):
        ids = batches[step % 2]
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        losses.append(round(loss.item(), 5))
    return {"mode": mode, "world_size": engine.world_size, "leaves": leaves, "losses": losses}


def main():
    import deepspeed
    import torch
    import transformers

    runs = []
    for nproc in (1, 2):
        for mode in MODES:
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                                   "--master_port", "29671", str(HERE), mode],
                                  capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
            lines = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            if proc.returncode or not lines:
                runs.append({"mode": mode, "world_size": nproc, "exit": proc.returncode, "stderr": proc.stderr[-1500:]})
                continue
            assert all(r["losses"] == lines[0]["losses"] for r in lines), "ranks disagree"
            runs.append(lines[0])
            print(nproc, mode, lines[0]["losses"], file=sys.stderr, flush=True)
    results = {"command": "python benchmarks/cpu/leaf_modules/probe.py",
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "deepspeed": deepspeed.__version__},
               "runs": runs}
    (HERE.parent / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print("RESULT " + json.dumps(train(sys.argv[1])), flush=True)
    else:
        main()
