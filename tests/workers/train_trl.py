"""TRL's trainers under an hf_zero preset, written as a user writes them: SFTTrainer on chat data with
assistant-only loss (optionally LoRA), DPOTrainer with its reference model, and GRPOTrainer generating with the
model itself (no vLLM) and a reward function.

Rank 0 writes result.json and the engine's gathered weights (expected.safetensors) next to the saved model.
"""

import argparse
import json
import os
from pathlib import Path

import datasets
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
from hf_zero.compat.hf_api import checkpointing_arg_name

# ChatML with the generation markers TRL's assistant-only loss reads
TRAINING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}\n"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTIONS = ["what is two plus two", "hello how are you", "what is the movie", "how was the cast"]
ANSWERS = ["it is four", "i am fine thanks", "the movie was great", "the cast was fine"]


def chat_data(n=16):
    rows = [{"messages": [{"role": "user", "content": QUESTIONS[i % 4]}, {"role": "assistant", "content": ANSWERS[i % 4]}]}
            for i in range(n)]
    return datasets.Dataset.from_list(rows)


def preference_data(n=16):
    rows = [{"prompt": [{"role": "user", "content": QUESTIONS[i % 4]}],
             "chosen": [{"role": "assistant", "content": ANSWERS[i % 4]}],
             "rejected": [{"role": "assistant", "content": "a dull plot with bad acting"}]} for i in range(n)]
    return datasets.Dataset.from_list(rows)


def prompt_data(n=16):
    return datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": QUESTIONS[i % 4]}]} for i in range(n)])


def reward_four(completions, **kwargs):
    """1 for each completion that says "four": a reward a tiny model can learn to chase."""
    return [float("four" in (c[0]["content"] if isinstance(c, list) else c)) for c in completions]


CONFIGS = {"sft": ("SFTConfig", "SFTTrainer", {"assistant_only_loss": True}, 1e-3),
           "dpo": ("DPOConfig", "DPOTrainer", {"beta": 0.1}, 5e-3),
           "grpo": ("GRPOConfig", "GRPOTrainer", {"num_generations": 2, "max_completion_length": 6, "beta": 0.0}, 1e-3)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--trainer", choices=sorted(CONFIGS), default="sft")
    p.add_argument("--deepspeed", default=None, help="a preset or JSON; none under accelerate launch --config_file")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lora", action="store_true")
    p.add_argument("--gc", action="store_true", help="gradient checkpointing (TRL picks its kwargs for PEFT + ZeRO-3)")
    p.add_argument("--callback", choices=["attach", "instance"], default="instance")
    p.add_argument("--long-context", action="store_true", help="ZeroCallback(long_context=True)")
    p.add_argument("--local_rank", type=int, default=None)
    opts = p.parse_args()

    import trl

    config_name, trainer_name, extra, lr = CONFIGS[opts.trainer]
    config_class = hf_zero.zero_arguments(getattr(trl, config_name))
    # the newest spelling (transformers 5.23 renamed it; the old one warns there)
    checkpointing = checkpointing_arg_name(config_class)
    if opts.trainer != "grpo":
        extra = {**extra, "max_length": 64}
    args = config_class(output_dir=opts.out, per_device_train_batch_size=2, max_steps=opts.steps, learning_rate=lr,
                        logging_steps=1, report_to=[], save_strategy="no", deepspeed=opts.deepspeed, seed=0,
                        disable_tqdm=True, lr_scheduler_type="constant", **{checkpointing: opts.gc}, **extra)
    tokenizer = AutoTokenizer.from_pretrained(opts.model)
    tokenizer.chat_template = TRAINING_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32)  # zero.Init under ZeRO-3: args exist
    partitioned_at_load = hf_zero.is_partitioned(model)
    peft_config = None
    if opts.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer_class = getattr(trl, trainer_name)
    options = {"long_context": True} if opts.long_context else {}
    callbacks = [hf_zero.ZeroCallback(**options)] if opts.callback == "instance" else None
    data = {"sft": chat_data, "dpo": preference_data, "grpo": prompt_data}[opts.trainer]()
    rewards = {"reward_funcs": reward_four} if opts.trainer == "grpo" else {}
    trainer = trainer_class(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                            peft_config=peft_config, callbacks=callbacks, **rewards)
    if opts.callback == "attach":
        hf_zero.attach(trainer, **options)
    trainer.train()

    out = Path(opts.out)
    if opts.lora:
        hf_zero.lora.save_adapter(trainer, out / "adapter")  # every rank: a gather
        expected = hf_zero.lora.adapter_state_dict(trainer.model)
    else:
        expected = hf_zero.gathered_state_dict(trainer.model)  # a collective: every rank enters
        trainer.save_model(str(out / "final"))
    if trainer.is_world_process_zero():
        from safetensors.torch import save_file

        save_file(expected, str(out / "expected.safetensors"))
        first = trainer.train_dataset[0]
        ref = getattr(trainer, "ref_model", None)
        callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, hf_zero.ZeroCallback))
        result = {
            "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
            "completion_lengths": [e["completions/mean_length"] for e in trainer.state.log_history
                                   if "completions/mean_length" in e],
            "engine": type(trainer.model_wrapped).__name__,
            "dp_world_size": getattr(trainer.model_wrapped, "dp_world_size", None),
            # what the engine runs, as DeepSpeed itself reports it (not what the config asked for)
            "zero_stage": getattr(trainer.model_wrapped, "zero_optimization_stage", lambda: None)(),
            "optimizer_offloaded": getattr(trainer.model_wrapped, "zero_cpu_offload", lambda: None)(),
            "partitioned_at_load": partitioned_at_load,
            "warnings": callback.warnings,
            # assistant-only loss: the prompt's tokens carry label -100
            "trained_tokens": sum(label != -100 for label in first.get("labels", [])), "tokens": len(first.get("input_ids", [])),
            "ref_model": type(ref).__name__ if ref is not None else None,
            "ref_partitioned": hf_zero.is_partitioned(ref.module if hasattr(ref, "module") else ref) if ref is not None else None,
            # what this rank holds of the reference model: whole tensors, and its ZeRO-3 shards
            "ref_local_numel": sum(p.numel() for p in ref.parameters()) if ref is not None else None,
            "ref_shard_numel": sum(p.ds_tensor.numel() for p in ref.parameters() if hasattr(p, "ds_tensor"))
            if ref is not None else None,
            "ref_full_numel": sum(getattr(p, "ds_numel", p.numel()) for p in ref.parameters()) if ref is not None else None,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "long_context": str(hf_zero.long_context.long_context_of(trainer.model)),
            "use_reentrant": (getattr(trainer.args, "activation_checkpointing_kwargs", None)
                              or getattr(trainer.args, "gradient_checkpointing_kwargs", None) or {}).get("use_reentrant"),
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))
    if opts.lora and trainer.is_world_process_zero():
        hf_zero.lora.merge_and_save(out / "adapter", opts.model, out / "merged")
    hf_zero.shutdown()
    print("hf_zero-test: worker finished", flush=True)


if __name__ == "__main__":
    main()
