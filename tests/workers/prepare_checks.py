"""hf_zero.prepare's checks, each with a real Accelerator, a real DeepSpeed config and a real engine, in one process.

The Accelerate door's twin of attach_checks.py: each scenario builds hf_zero.accelerator() with a DeepSpeed plugin, a
model and an optimizer, calls hf_zero.prepare (which builds the engine unless a check refuses first), and records what
the checks said (or the error raised) and what they changed; results go to OUT/prepare_checks.json, one entry per
scenario, for tests/checks/test_doors.py.
"""

import psutil
import torch
from accelerate.utils import DeepSpeedPlugin
from transformers import AutoModelForCausalLM

import deprecation_guard  # noqa: F401  (hf_zero calling a deprecated API fails the run)
import hf_zero
from hf_zero.accelerate import run_of
from hf_zero.compat.hf_api import enable_model_checkpointing
from hf_zero.zero3.recompute import recompute_problems
from scenario_runner import main, reset_accelerate


def config_of(preset: str, **zero) -> dict:
    config = hf_zero.load_config(preset)
    config["zero_optimization"].update(zero)
    config["train_micro_batch_size_per_gpu"] = 2
    config["gradient_accumulation_steps"] = 1
    config.pop("train_batch_size", None)
    return config


def lora(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)  # peft draws lora_A from the global generator: the same adapters in every scenario
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def scenarios(model_path: str, out):
    def load(dtype=torch.float32):
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)

    def run(name, config, *, mixed_precision="no", load_first=False, adapt=None, checkpointing=None, extra=None,
            accelerator_options=None, optimizer=torch.optim.AdamW, **prepare_options):
        reset_accelerate()
        dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float32
        model = load(dtype) if load_first else None  # built whole, before the Accelerator's zero.Init exists
        accelerator = None
        try:
            accelerator = hf_zero.accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config),
                                              mixed_precision=mixed_precision, **(accelerator_options or {}))
            model = model if model is not None else load(dtype)
            if adapt:
                model = adapt(model)
            if checkpointing is not None:
                enable_model_checkpointing(model, checkpointing)
            optimizer = optimizer([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            engine, _ = hf_zero.prepare(accelerator, model, optimizer, **prepare_options)
            found = (extra or (lambda e, r: {}))(engine, run_of(accelerator))
            result = {"warnings": run_of(accelerator).warnings, "error": None, **found}
        except hf_zero.ConfigError as e:
            result = {"warnings": run_of(accelerator).warnings if accelerator is not None else [], "error": str(e)}
        except ValueError as e:  # not hf_zero's refusal: what Accelerate or DeepSpeed says once a check is skipped
            result = {"warnings": [], "error": f"{type(e).__name__}: {e}"}
        if accelerator is not None and accelerator in hf_zero.accelerate.runs.RUNS:
            result["ran"] = [list(entry) for entry in run_of(accelerator).ran]
        return name, result

    def adapter_dtypes(engine, _):
        return {"adapter_dtypes": sorted({str(p.dtype) for p in engine.module.parameters() if p.requires_grad})}

    def leaves_of(kind):  # the user's own ZeRO-3 leaves: the inner base model (a ModelOutput), or its decoder layers
        def make(model):
            from deepspeed.utils import set_z3_leaf_modules

            set_z3_leaf_modules(model, [type(model.model) if kind == "model" else type(model.model.layers[0])])
            return model
        return make

    def steps(engine, _):  # the README loop's steps: the leaf guard speaks at the first forward, or stays out of the way
        batches = [torch.arange(3 + i, 19 + i).repeat(2, 1) for i in range(2)]
        losses = []
        for i in range(4):
            loss = engine(input_ids=batches[i % 2], labels=batches[i % 2]).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return {"losses": losses}

    def leaf_path(engine, run):  # the steps, and whether DeepSpeed's fast leaf path is still on after prepare
        from hf_zero.compat.deepspeed_api import param_coordinator

        return {**steps(engine, run), "fast_leaf_path": param_coordinator(engine).fast_sharding_for_leaf_module}

    def leaf_classes(engine, run):  # the steps, and the ZeRO-3 leaves the engine was built with
        from hf_zero.compat.deepspeed_api import is_leaf

        return {**steps(engine, run), "leaves": [type(m).__name__ for m in engine.module.modules() if is_leaf(m)]}

    def judged(engine, run):  # the real model and config, judged as two DeepSpeed releases would run them
        return {version: recompute_problems(engine.module, run.config, run.checkpointing_kwargs or {}, version,
                                            in_loop=True) for version in ("0.19.2", "0.19.3")}

    yield run("zero2", config_of("zero2"))
    yield run("config_warning", config_of("zero2", stage3_param_persistence_threshold=10))
    yield run("config_warning_skipped", config_of("zero2", stage3_param_persistence_threshold=10),
              accelerator_options={"skip_checks": ["deepspeed-config/stage3-key-in-stage12"]})
    yield run("built_whole", config_of("zero3"), load_first=True)
    yield run("cast_adapters", config_of("zero3"), mixed_precision="bf16", adapt=lora, extra=adapter_dtypes)
    yield run("keep_adapters", config_of("zero3"), mixed_precision="bf16", adapt=lora, extra=adapter_dtypes,
              cast_adapters=False)
    yield run("lora_non_reentrant", config_of("zero3"), adapt=lora, checkpointing={"use_reentrant": False}, extra=judged)
    yield run("lora_reentrant", config_of("zero3"), adapt=lora, checkpointing={"use_reentrant": True}, extra=judged)
    yield run("leaf_model", config_of("zero3"), adapt=leaves_of("model"), extra=steps)
    yield run("leaf_layers", config_of("zero3"), adapt=leaves_of("layers"), extra=leaf_path)
    # any granularity threshold above 0 turns DeepSpeed's fast leaf path on; 1 makes no module a leaf by itself. On CPU
    # gpu-only-settings would set it to 0 (that path's release fails on CPU tensors), so it is skipped here
    yield run("leaf_layers_threshold", config_of("zero3", stage3_module_granularity_threshold=1),
              adapt=leaves_of("layers"), extra=leaf_path, accelerator_options={"skip_checks": ["gpu-only-settings"]})
    yield run("no_leaves", config_of("zero3"), extra=steps, leaves="off")
    yield run("default_leaves", config_of("zero3"), extra=leaf_classes)
    # LoRA with decoder-layer leaves: the first layer's input (the frozen embedding's output) needs no gradient
    yield run("lora_leaf_layers", config_of("zero3"), adapt=lambda model: lora(leaves_of("layers")(model)), extra=steps)
    yield run("lora_no_leaves", config_of("zero3"), adapt=lora, extra=steps, leaves="off")
    # a config that names DeepSpeed's optimizer: another torch optimizer is refused, an AdamW configures it
    named = {**config_of("zero2"), "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    yield run("optimizer_sgd", named, optimizer=torch.optim.SGD)
    yield run("optimizer_adamw", named)
    yield run("optimizer_sgd_skipped", named, optimizer=torch.optim.SGD, skip_checks=["optimizer-type"])
    # zero3_nvme's swap buffer below the largest parameter (16,384 elements) of a model built whole
    nvme = hf_zero.load_config("zero3_nvme", nvme_path=out)
    nvme["zero_optimization"]["offload_param"]["buffer_size"] = 4096
    nvme.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1)
    nvme.pop("train_batch_size", None)
    yield run("nvme_buffer_small", nvme, load_first=True)
    # a host smaller than the model states: the node's memory as psutil reports it, 1 MiB
    real = psutil.virtual_memory
    psutil.virtual_memory = lambda: real()._replace(total=2**20)
    try:
        yield run("host_memory", config_of("zero2_offload"))
        yield run("host_memory_skipped", config_of("zero2_offload"), skip_checks=["host-memory"])
    finally:
        psutil.virtual_memory = real


if __name__ == "__main__":
    main(scenarios, "prepare_checks.json")
