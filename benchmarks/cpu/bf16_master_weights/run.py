"""How many bf16 weights an update moves with DeepSpeed ZeRO-2 CPU offload, fp32 master weights (the shipped
offload presets) against bf16_master_weights_and_grads + bf16_optimizer_states: a 256x256 + 256x1 model, AdamW, 10 steps
on one CPU process. Prints one JSON line.

    for m in fp32 bf16; do for lr in 1e-5 1e-4; do python run.py $m $lr; done; done | grep "^{" > results.jsonl
"""
import json
import os
import sys

import deepspeed
import torch

os.environ.setdefault("MASTER_ADDR","127.0.0.1"); os.environ.setdefault("MASTER_PORT","29533"); os.environ.setdefault("RANK","0"); os.environ.setdefault("WORLD_SIZE","1"); os.environ.setdefault("LOCAL_RANK","0")
bf16_master = sys.argv[1] == "bf16"
lr = float(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 1))
start = [p.detach().clone().to(torch.bfloat16) for p in model.parameters()]
cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "bf16": {"enabled": True, "bf16_master_weights_and_grads": bf16_master, "bf16_optimizer_states": bf16_master},
       "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
       "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": False}}, "steps_per_print": 10**9}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
x = torch.randn(8, 256, dtype=torch.bfloat16); y = torch.randn(8, 1, dtype=torch.bfloat16)
for step in range(10):
    loss = ((engine(x) - y) ** 2).mean(); engine.backward(loss); engine.step()
changed = sum((p.detach() != s).sum().item() for p, s in zip(engine.module.parameters(), start))
total = sum(p.numel() for p in engine.module.parameters())
print(json.dumps({"bf16_master": bf16_master, "lr": lr, "changed_fraction": changed / total, "loss": loss.item()}))
