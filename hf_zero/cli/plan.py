"""``hf-zero plan MODEL --gpus N``: per-GPU memory of DDP and each preset, and the one to use."""

import contextlib
import json
import os
import sys
from pathlib import Path

from ..distributed import gpu_memory_bytes
from ..errors import ConfigError
from ..output_paths import refuse_overlaps
from ..planner import (GIB, LONG_CONTEXT_PARTS, MAX_LAYERS_SEARCHED, PARTIAL_OFFLOAD_SUB_GROUP, ModelShape, RunShape,
                       make_plan)

_COMPONENTS = ("parameters", "gradients", "optimizer", "step", "activations", "buffers", "reference model")
_SHORT = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "activations": "activ",
          "reference model": "ref"}
# numeric flags and the least each may be: one message and exit 2 below that, never a plan of nonsense
_AT_LEAST = {"gpus": 1, "nodes": 1, "seq": 1, "micro_batch": 1, "sequence_parallel": 1, "gradient_accumulation_steps": 1,
             "sub_group_size": 1}
_POSITIVE = ("gpu_mem", "cpu_mem", "nvme_mem")


def _components(plan) -> tuple:
    """The memory components to show: the reference model's only when the plan has one."""
    return tuple(c for c in _COMPONENTS if c != "reference model" or any(c in e.gpu for e in plan.estimates))


def add_parser(subparsers):
    p = subparsers.add_parser("plan", help="which ZeRO setup fits a model on your GPUs (no weights are loaded)",
                              description="Estimate per-GPU memory for DDP and every hf_zero preset, and pick the fastest that fits.")
    p.add_argument("model", help="Hub id, model folder, or config.json")
    p.add_argument("--gpus", type=int, required=True, help="GPUs per node")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpu-mem", type=float, help="GiB per GPU (default: this machine's GPU)")
    p.add_argument("--cpu-mem", type=float, help="GiB of host memory per node (checks offload)")
    p.add_argument("--nvme-mem", type=float, metavar="GIB",
                   help="GiB of disk per node for DeepSpeed's NVMe swap files (checks zero3_nvme; default: no limit)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length")
    p.add_argument("--micro-batch", type=int, default=1, help="per-GPU micro batch")
    p.add_argument("--gradient-accumulation-steps", type=int, default=1, metavar="N",
                   help="micro-batches per optimizer step (accumulated gradients stay alive; offload buffers)")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--torch-compile", action="store_true",
                   help="the run uses TrainingArguments(torch_compile=True): fused layers keep fewer activations")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--lora-r", type=int, default=0, metavar="R",
                   help="plan a peft LoRA adapter of rank R on the frozen model (as hf-zero finetune --lora_r)")
    p.add_argument("--lora-target-modules", default="all-linear", metavar="NAMES",
                   help="with --lora-r: comma-separated Linear names of the decoder layers, or all-linear (the default)")
    p.add_argument("--reference-model", action="store_true",
                   help="TRL's DPO/KTO: count the frozen reference copy (whole on each GPU under DDP and ZeRO-1/2, "
                        "partitioned under ZeRO-3; none with --lora-r)")
    p.add_argument("--sequence-parallel", type=int, default=1, metavar="N",
                   help="DeepSpeed's Ulysses sequence parallelism over N GPUs (Accelerate's sp_size): each GPU holds "
                        "seq/N tokens of activations; N divides the GPUs and the attention heads")
    p.add_argument("--long-context", nargs="?", const="all", default="", metavar="PARTS",
                   help="plan hf_zero's long-context switch: all parts, or a comma-separated subset of "
                        f"{', '.join(LONG_CONTEXT_PARTS)} (offload_activations implies gradient checkpointing)")
    p.add_argument("--config", metavar="FILE_OR_NAME",
                   help="plan this DeepSpeed config (a JSON file or a preset name) from its keys, instead of DDP and "
                        "every preset")
    p.add_argument("--offload-ratio", type=float, default=None, metavar="R",
                   help="zero3_offload: the share of the optimizer stepped on the host (offload_optimizer.ratio); "
                        "the rest keeps its fp32 states on the GPU")
    p.add_argument("--params-on-gpu", action="store_true",
                   help="zero3_offload: keep the 16-bit parameters on the GPU (no offload_param block)")
    p.add_argument("--sub-group-size", type=int, default=None, metavar="N",
                   help="zero3_offload: elements per optimizer sub-group, the unit --offload-ratio splits "
                        "(default: the preset's sub_group_size)")
    p.add_argument("--largest", action="store_true",
                   help="for each setup, the deepest model of MODEL's shape (hidden size, heads, intermediate size, "
                        "vocabulary) that fits, and which resource (GPU, host, NVMe) stops it")
    p.add_argument("--largest-configs", metavar="DIR",
                   help="with --largest: write each setup's largest model as DIR/<setup>/config.json "
                        "(for the benchmark harness --model)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--plot", metavar="PNG", help="write a stacked bar chart of GPU memory per setup")
    p.add_argument("--write", metavar="JSON", help="write a DeepSpeed config for the recommended setup")
    p.set_defaults(run=run, loads_deepspeed=True)
    return p


def load_model_config(model: str):
    """A transformers config: one of the benchmark's built-in models (the benchmark harness --model), a config.json, a
    model folder or a Hub id."""
    from transformers import AutoConfig

    from ..model_configs import MODELS, build_config, resolve_model

    path = Path(model)
    if model in MODELS and not path.exists():
        return build_config(resolve_model(model)[1])
    try:
        if path.is_file():
            data = json.loads(path.read_text())
            if "model_type" not in data:
                raise ConfigError(f"{model!r} has no model_type; pass a transformers config.json")
            return AutoConfig.for_model(**data)
        return AutoConfig.from_pretrained(model, trust_remote_code=False)  # a planner has no reason to run a repo's code
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read a model config from {model!r} (a Hub id, a folder with config.json, a "
                          f"config.json, or a built-in model: {', '.join(MODELS)}): {str(e).splitlines()[0]}") from None


def _gpu_mem(args) -> float:
    if args.gpu_mem is not None:
        return args.gpu_mem
    total = gpu_memory_bytes()
    if total is None:
        raise ConfigError("no GPU here to read its memory from; pass --gpu-mem GiB (e.g. 80 for an A100/H100 80GB)")
    return total / GIB


def _partial_offload_lines(share: float | None, config_given: bool) -> list:
    """The faster split an offload choice has room for: how to plan it, with the flags or, for a --config, its keys."""
    if share is None:
        return []
    how = (f"its keys: zero_optimization.offload_optimizer.ratio {share:g}, no offload_param, sub_group_size "
           f"{PARTIAL_OFFLOAD_SUB_GROUP}" if config_given else
           f"plan and --write it with --offload-ratio {share:g} --params-on-gpu --sub-group-size "
           f"{PARTIAL_OFFLOAD_SUB_GROUP}")
    return [f"  also fits: zero3_offload with {share:.0%} of the optimizer on the host and the parameters on the GPU; "
            + how, "    (measured faster than zero2_offload on one GPU: hf_zero's docs, planner.md)"]


def render(plan, config_given: bool = False) -> str:
    m, r = plan.model, plan.run
    parts = ",".join(r.long_context)
    active = "" if m.active_params is None else f" ({m.active_params / 1e9:.2f}B active per token)"
    lines = [f"{m.name}: {m.params / 1e9:.2f}B parameters{active} on {r.gpus_per_node} GPU(s) x {r.nodes} node(s), "
             f"{plan.gpu_capacity / GIB:.0f} GiB each; seq {r.seq}, micro batch {r.micro_batch}, {r.dtype}"
             f"{', gradient checkpointing' if r.checkpointing else ''}"
             f"{f', sequence parallel {r.sequence_parallel}' if r.sequence_parallel > 1 else ''}"
             f"{f', long context: {parts}' if parts else ''}"
             f"{', torch.compile' if r.compiled else ''}"
             f"{f', LoRA r={r.lora_r} on {_targets(m, r)}' if r.lora_r else ''}", ""]
    components = _components(plan)
    head = (f"{'setup':<14}" + "".join(f"{_SHORT.get(c, c):>9}" for c in components)
            + f"{'GPU GiB':>10}{'host GiB':>10}{'NVMe GiB':>10}{'max seq':>12}  peak in")
    lines.append(head)
    for est in plan.estimates:
        cells = "".join(f"{est.gpu.get(c, 0) / GIB:>9.1f}" for c in components)
        mark = "  <- recommended" if est.setup == plan.choice else ""
        longest = plan.max_seq[est.setup]
        longest = "-" if longest is None else f"{longest:,}"
        lines.append(f"{est.setup:<14}{cells}{est.gpu_total / GIB:>10.1f}{est.host_per_node / GIB:>10.1f}"
                     f"{est.nvme_per_node / GIB:>10.1f}{longest:>12}  {est.phase}{mark}")
    lines.append("")
    if plan.choice:
        lines.append(f"Recommended: {plan.choice} ({plan.reasons[plan.choice]})")
    else:
        lines.append("Nothing fits: add GPUs or nodes, lower --micro-batch or --seq, or use --gradient-checkpointing.")
    lines += _partial_offload_lines(plan.partial_offload, config_given)
    for setup in (e.setup for e in plan.estimates):
        if setup != plan.choice and not plan.reasons[setup].startswith("fits"):
            lines.append(f"  not {setup}: {plan.reasons[setup]}")
    parallel = r.sequence_parallel > 1
    lines.append(f"max seq: the longest sequence that fits (micro batch {r.micro_batch}) in 90% of each GPU"
                 f"{' and of host memory' if plan.cpu_capacity else ''}"
                 f"{' and of NVMe' if plan.nvme_capacity else ''}"
                 f"{f', a multiple of {r.sequence_parallel} (the sequence-parallel size)' if parallel else ''}")
    return "\n".join(lines)


def render_largest(plan) -> str:
    """The --largest table: each setup's deepest model of the plan's shape, its memory and what stops it."""
    m, r = plan.model, plan.run
    limited = ["each GPU"] + (["of host memory"] if plan.cpu_capacity else []) + (["of NVMe"] if plan.nvme_capacity else [])
    within = " and ".join([", ".join(limited[:-1]), limited[-1]] if len(limited) > 1 else limited)
    lines = [f"Largest model of {m.name}'s shape (hidden {m.hidden}, intermediate {m.intermediate}, {m.heads} heads, "
             f"vocab {m.vocab}; {m.largest_layer / 1e6:.1f}M parameters per layer) in 90% of {within} "
             f"(seq {r.seq}, micro batch {r.micro_batch}{', gradient checkpointing' if r.checkpointing else ''}):", "",
             f"{'setup':<14}{'layers':>8}{'params B':>10}{'GPU GiB':>10}{'host GiB':>10}{'NVMe GiB':>10}  limit"]
    for setup, found in plan.largest.items():
        limit = " and ".join(found.limit) or f"none up to {MAX_LAYERS_SEARCHED} layers"
        if found.model is None:
            lines.append(f"{setup:<14}{'none fits':>10}{'':>38}  {limit}")
            continue
        est = found.estimate
        lines.append(f"{setup:<14}{found.model.layers:>8}{found.model.params / 1e9:>10.2f}{est.gpu_total / GIB:>10.1f}"
                     f"{est.host_per_node / GIB:>10.1f}{est.nvme_per_node / GIB:>10.1f}  {limit}")
    lines.append("limit: the resource one more layer would overflow (for 'none fits', the first layer)"
                 + ("" if plan.cpu_capacity else "; host memory is not limited without --cpu-mem")
                 + ("" if plan.nvme_capacity else "; NVMe is not limited without --nvme-mem"))
    return "\n".join(lines)


def largest_config(config, layers: int) -> dict:
    """The model's config.json with ``layers`` decoder layers, the rest unchanged (what transformers and
    the benchmark harness --model read). A per-layer list sized to the old depth (layer_types) is dropped, so that
    transformers fills in its default for the new depth."""
    data = config.to_diff_dict()
    data["num_hidden_layers"] = layers
    data.pop("layer_types", None)
    return data


def _largest_dir(args) -> Path | None:
    """--largest-configs' folder, created and writable; checked before any planning."""
    if args.largest_configs is None:
        return None
    if not args.largest:
        raise ConfigError("--largest-configs writes the models that --largest finds; add --largest")
    folder = Path(args.largest_configs)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--largest-configs: cannot create the folder {str(folder)!r} ({e.strerror or e}); "
                          "pass a folder you can write to") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--largest-configs: the folder {str(folder)!r} is not writable; pass a folder you can "
                          "write to")
    return folder


def write_largest_configs(plan, config, folder: Path) -> list:
    """DIR/<setup>/config.json for each setup whose largest model exists; the paths written."""
    written = []
    for setup, found in plan.largest.items():
        if found.model is None:
            continue
        path = folder / setup / "config.json"
        try:
            path.parent.mkdir(exist_ok=True)
            path.write_text(json.dumps(largest_config(config, found.model.layers), indent=2) + "\n")
        except OSError as e:
            raise ConfigError(f"--largest-configs: cannot write {str(path)!r} ({e.strerror or e})") from None
        written.append(path)
    return written


def _targets(model, run) -> str:
    names = model.lora_targets(run.lora_targets)
    trained = model.adapter_params(run.lora_r, run.lora_targets)
    return f"{','.join(names)} ({trained / 1e6:.1f}M trainable parameters)"


def _lora(args) -> tuple:
    if args.lora_r < 0:
        raise ConfigError(f"--lora-r must be 0 (full fine-tuning) or a positive rank, got {args.lora_r}")
    names = tuple(t.strip() for t in args.lora_target_modules.split(",") if t.strip())
    if not names:
        raise ConfigError("--lora-target-modules is empty; name Linear layers (e.g. q_proj,v_proj) or all-linear")
    return args.lora_r, names


def plot(plan, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [e.setup for e in plan.estimates]
    bottom = [0.0] * len(names)
    for component in _components(plan):
        values = [e.gpu.get(component, 0) / GIB for e in plan.estimates]
        ax.bar(names, values, bottom=bottom, label=component)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(plan.gpu_capacity / GIB, color="black", linestyle="--", label="GPU memory")
    ax.set_ylabel("GiB per GPU")
    lora = f", LoRA r={plan.run.lora_r}" if plan.run.lora_r else ""
    ax.set_title(f"{plan.model.name}: {plan.model.params / 1e9:.2f}B params{lora}, {plan.run.ranks} GPU(s)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_config(plan, path, configs: dict | None = None) -> None:
    from ..config.dotted import set_dotted
    from ..config.presets import load_config

    if plan.choice in (None, "ddp"):
        raise ConfigError(f"the plan recommends {plan.choice or 'nothing'}: there is no DeepSpeed config to write")
    planned = (configs or {}).get(plan.choice)
    config = load_config(planned if planned is not None else plan.choice)
    # a bucket bigger than the model only costs memory
    bucket = min(500_000_000, plan.model.params)
    for key in ("zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size",
                "zero_optimization.stage3_prefetch_bucket_size"):
        parent, leaf = key.rsplit(".", 1)
        if leaf in config["zero_optimization"]:
            set_dotted(config, key, bucket)
    if plan.run.lora_r and config["zero_optimization"].get("stage3_module_granularity_threshold"):
        # leaf modules break a frozen base with adapters in DeepSpeed 0.19.8 (ZeroCallback turns them off too)
        set_dotted(config, "zero_optimization.stage3_module_granularity_threshold", 0)
    Path(path).write_text(json.dumps(config, indent=2) + "\n")


def _check_numbers(args) -> None:
    for name, least in _AT_LEAST.items():
        if getattr(args, name) is not None and getattr(args, name) < least:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(args, name)}")
    for name in _POSITIVE:
        value = getattr(args, name)
        if value is not None and not value > 0:  # also NaN
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive number of GiB, got {value:g}")
    if args.offload_ratio is not None and not 0 <= args.offload_ratio <= 1:  # also NaN
        raise ConfigError(f"--offload-ratio must be between 0 and 1 (the share of the optimizer on the host), "
                          f"got {args.offload_ratio:g}")


def _long_context(text: str) -> tuple:
    """The long-context parts named by --long-context: "all" (or no value) for every part."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if "all" in names:
        return LONG_CONTEXT_PARTS
    unknown = [n for n in names if n not in LONG_CONTEXT_PARTS]
    if unknown:
        raise ConfigError(f"--long-context: unknown part {', '.join(map(repr, unknown))}; name some of "
                          f"{', '.join(LONG_CONTEXT_PARTS)} (comma-separated), or all")
    return tuple(n for n in LONG_CONTEXT_PARTS if n in names)


def _check_layout(model, run_shape) -> None:
    """Ulysses splits the world into groups of sp GPUs and gives each GPU heads / sp whole attention heads."""
    sp, world = run_shape.sequence_parallel, run_shape.ranks
    if world % sp:
        raise ConfigError(f"--sequence-parallel {sp} does not divide the {world} GPU(s) of the plan (--gpus x "
                          f"--nodes): Ulysses groups are {sp} GPUs each. Fix: a size that divides {world}, or more GPUs.")
    if sp > 1 and model.heads and model.heads % sp:
        raise ConfigError(f"--sequence-parallel {sp} does not divide {model.name}'s {model.heads} attention heads "
                          "(Ulysses gives each GPU whole heads). Fix: a size that divides the head count.")


def configs_to_plan(args) -> dict:
    """Name -> DeepSpeed config for make_plan, each planned from its keys: the --config alone, or DDP (None) and every
    preset in recipes/, the zero3_offload preset with its placement flags. A layout the planner does not model is
    refused here, naming the file."""
    from ..config.presets import is_preset_name, load_config, preset_path
    from ..planner import layout_of_config, preset_configs

    if args.config is None:
        configs = preset_configs()
        for name, config in configs.items():
            if config is not None:
                layout_of_config(config, source=f"preset {name!r} ({preset_path(name)})")
        if "zero3_offload" in configs:
            _place_zero3_offload(configs["zero3_offload"], args)
        return configs
    placement = [flag for flag, value in (("--offload-ratio", args.offload_ratio),
                                          ("--sub-group-size", args.sub_group_size),
                                          ("--params-on-gpu", args.params_on_gpu or None)) if value is not None]
    if placement:
        raise ConfigError(f"{', '.join(placement)} set a preset's placement; with --config the config's own "
                          "keys (offload_optimizer.ratio, sub_group_size, offload_param) say it. Fix: set them in "
                          "the config, or drop --config")
    config = load_config(args.config)
    if layout_of_config(config, source=f"--config {args.config}") is None:
        raise ConfigError(f"--config {args.config}: zero_optimization.stage is 0 or missing, so there is no ZeRO "
                          "layout to plan. Fix: pass a ZeRO config (stage 1, 2 or 3), or leave --config out to "
                          "plan DDP and every preset")
    name = args.config.removesuffix(".json") if is_preset_name(args.config) else Path(args.config).stem
    return {name: config}


def _place_zero3_offload(config: dict, args) -> None:
    """--offload-ratio, --sub-group-size and --params-on-gpu: the zero3_offload preset's placement keys."""
    from ..config.dotted import set_dotted

    if args.offload_ratio is not None:
        set_dotted(config, "zero_optimization.offload_optimizer.ratio", args.offload_ratio)
    if args.sub_group_size is not None:
        set_dotted(config, "zero_optimization.sub_group_size", args.sub_group_size)
    if args.params_on_gpu:
        config["zero_optimization"].pop("offload_param", None)


def _refuse_writing_over_inputs(args) -> None:
    from ..config.presets import is_preset_name, preset_path

    config = preset_path(args.config) if is_preset_name(args.config) else args.config
    refuse_overlaps({"--write": args.write, "--plot": args.plot, "--largest-configs": args.largest_configs},
                    {"MODEL": args.model if Path(args.model).exists() else None, "--config": config})


def run(args) -> int:
    _check_numbers(args)
    _refuse_writing_over_inputs(args)
    configs = configs_to_plan(args)
    configs_dir = _largest_dir(args)
    lora_r, lora_targets = _lora(args)
    long_context = _long_context(args.long_context)
    with contextlib.redirect_stdout(sys.stderr):  # transformers/DeepSpeed chatter stays off the report
        config = load_model_config(args.model)
        model = ModelShape.from_config(config, name=Path(args.model).name if Path(args.model).exists() else args.model)
    run_shape = RunShape(gpus_per_node=args.gpus, nodes=args.nodes, seq=args.seq, micro_batch=args.micro_batch,
                         accumulation=args.gradient_accumulation_steps,
                         gradient_checkpointing=args.gradient_checkpointing, dtype=args.dtype,
                         compiled=args.torch_compile, lora_r=lora_r, lora_targets=lora_targets,
                         reference_model=args.reference_model, sequence_parallel=args.sequence_parallel,
                         long_context=long_context)
    _check_layout(model, run_shape)
    if lora_r:
        try:
            model.lora_targets(lora_targets)
        except ValueError as e:
            raise ConfigError(f"--lora-target-modules: {e}") from None
    plan = make_plan(model, run_shape, _gpu_mem(args), args.cpu_mem, nvme_mem_gib=args.nvme_mem,
                     largest=args.largest, configs=configs)
    if args.json:
        report = {"model": model.__dict__, "run": run_shape.__dict__, "choice": plan.choice, "reasons": plan.reasons,
                  "partial_offload": plan.partial_offload,
                  "estimates": [{**e.as_dict(), "max_seq": plan.max_seq[e.setup]} for e in plan.estimates]}
        if args.largest:
            report["largest"] = {setup: found.as_dict() for setup, found in plan.largest.items()}
        print(json.dumps(report, indent=2))
    else:
        print(render(plan, config_given=args.config is not None))
        if args.largest:
            print("\n" + render_largest(plan))
    if configs_dir is not None:
        written = write_largest_configs(plan, config, configs_dir)
        print(f"wrote {len(written)} config.json file(s) under {configs_dir} (the benchmark harness --model "
              f"{configs_dir}/<setup>/config.json)", file=sys.stderr)
    if args.plot:
        plot(plan, args.plot)
    if args.write:
        write_config(plan, args.write, configs)
    return 0 if plan.choice else 1
