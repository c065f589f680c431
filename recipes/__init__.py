"""hf_zero's DeepSpeed presets, installed as the package ``hf_zero.recipes``.

Each preset is a DeepSpeed JSON file beside this one; every value the Trainer knows is "auto",
so ``--deepspeed recipes/zero3.json`` matches any TrainingArguments. A preset's Accelerate YAML is
written from its JSON (``hf-zero presets NAME --accelerate-config FILE``); accelerate/ holds only the
YAMLs of other layouts (several machines, sequence parallelism). The scheduler is deliberately left
out: the Trainer then builds the one ``--lr_scheduler_type`` asks for, instead of DeepSpeed's
WarmupDecayLR silently replacing it.
"""

DESCRIPTIONS = {
    "zero1": "ZeRO-1: optimizer states sharded; fastest DeepSpeed stage when the model and gradients fit on each GPU.",
    "zero2": "ZeRO-2: optimizer states and gradients sharded; near-DDP speed at much less memory (the usual choice).",
    "zero2_offload": "ZeRO-2 with the optimizer on the CPU (DeepSpeedCPUAdam): when optimizer states do not fit on the GPUs.",
    "zero3": "ZeRO-3: parameters sharded too, model loaded partitioned by zero.Init; for models too big for one GPU.",
    "zero3_offload": "ZeRO-3 with parameters and optimizer on the CPU: largest models on few GPUs, much slower.",
    "zero3_nvme": "ZeRO-Infinity: parameters and optimizer offloaded to NVMe; needs an NVMe folder (nvme_path) and libaio.",
}
