"""QLoRA under ZeRO-3 on one GPU: does ZeRO-3 partition a bitsandbytes 4-bit base, by its storage dtype, and what
ZeroCallback says. One run per process (a ZeRO-3 config lives for the process):

    python benchmarks/1xH200/qlora/qlora_zero3.py --storage uint8 --no-callback --out uint8_plain.json
    python benchmarks/1xH200/qlora/qlora_zero3.py --storage uint8 --out uint8_callback.json
    python benchmarks/1xH200/qlora/qlora_zero3.py --storage bfloat16 --out bfloat16_callback.json

The model is a random-init Llama-like model (hidden 1024, 12 layers, 32k vocabulary) saved once to --model-dir.
Each run records how many of the 4-bit weights are ZeRO-3 partitions (ds_numel set, local numel 0) after loading and
after training 3 steps of LoRA with the Trainer (bf16, micro batch 2, sequence 256)."""

import argparse
import json
import os
from pathlib import Path

import torch

os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--storage", choices=["uint8", "bfloat16"], required=True)
    p.add_argument("--no-callback", action="store_true")
    p.add_argument("--model-dir", default="/tmp/qlora_base")
    p.add_argument("--persistence", type=int, default=None,
                   help="stage3_param_persistence_threshold (the preset's 1e6 keeps small weights whole on purpose)")
    p.add_argument("--out", required=True)
    opts = p.parse_args()

    import bitsandbytes
    import peft
    import transformers
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, Trainer

    import hf_zero

    model_dir = Path(opts.model_dir)
    if not (model_dir / "config.json").exists():
        torch.manual_seed(0)
        config = LlamaConfig(hidden_size=1024, num_hidden_layers=12, intermediate_size=2816, vocab_size=32000,
                             num_attention_heads=16, num_key_value_heads=16)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(model_dir)

    deepspeed = hf_zero.load_config("zero3")
    if opts.persistence is not None:
        deepspeed["zero_optimization"]["stage3_param_persistence_threshold"] = opts.persistence
    args = hf_zero.TrainingArguments(output_dir="/tmp/qlora_out", deepspeed=deepspeed, bf16=True, max_steps=3,
                                     per_device_train_batch_size=2, learning_rate=1e-4, report_to=[],
                                     save_strategy="no", logging_steps=1, disable_tqdm=True)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                               bnb_4bit_quant_storage=getattr(torch, opts.storage))
    model = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quant, dtype=torch.bfloat16)
    weights = [m.weight for m in model.modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]
    def partitioned():  # ZeRO-3 partitions: ds_numel set, nothing held locally outside a gather
        return sum(1 for w in weights if hasattr(w, "ds_numel") and w.numel() == 0)

    def zero3_params():  # taken over by ZeRO-3 at all (partitioned, or kept whole as persistent)
        return sum(1 for w in weights if hasattr(w, "ds_id"))

    result = {"storage": opts.storage, "callback": not opts.no_callback, "persistence_threshold": opts.persistence, "linear4bit_weights": len(weights),
              "partitioned_4bit_weights_after_load": partitioned(),
              "weight_dtypes": sorted({str(w.dtype) for w in weights}),
              "gpu_gib_after_load": round(torch.cuda.memory_allocated() / 2**30, 3),
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "bitsandbytes": bitsandbytes.__version__, "peft": peft.__version__,
                           "deepspeed": __import__("deepspeed").__version__}}
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    ids = torch.randint(3, 32000, (16, 256), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": row, "labels": row.clone()} for row in ids]
    try:
        trainer = Trainer(model=model, args=args, train_dataset=data,
                          callbacks=[] if opts.no_callback else [hf_zero.ZeroCallback()])
        trainer.train()
        weights = [m.weight for m in model.modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]
        result["partitioned_4bit_weights_after_training"] = partitioned()
        result["zero3_4bit_weights_after_training"] = zero3_params()
        result["engine_param_dtypes"] = sorted({str(p.dtype) for p in trainer.model_wrapped.module.parameters()})
        result["losses"] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        result["error"] = None
    except (hf_zero.ConfigError, RuntimeError, ValueError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    result["gpu_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    Path(opts.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
