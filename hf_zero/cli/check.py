"""``hf-zero check CONFIG``: lint a DeepSpeed config with DeepSpeed's own parser and hf_zero's rules."""

import contextlib
import json
import sys
from pathlib import Path

from ..config.dotted import offload_devices
from ..config.findings import Finding
from ..config.json_file import read_json_object
from ..config.presets import is_preset_name, load_config, preset_path
from ..config.validate import validate_config
from ..distributed import has_gpu
from ..errors import ConfigError
from ..output_paths import refuse_overlaps


def add_parser(subparsers):
    p = subparsers.add_parser("check", help="check a DeepSpeed config (preset name or JSON file), and the installed releases",
                              description="Report every problem in a DeepSpeed config at once, then the installed "
                                          "releases against the ones hf_zero was tested on. Exit 1 on errors, 0 otherwise. "
                                          "Without a config: the releases only.")
    p.add_argument("config", nargs="?", help="preset name or path to a DeepSpeed JSON file")
    p.add_argument("--world-size", type=int, default=1, help="processes the run will have (nodes x processes per node)")
    p.add_argument("--sequence-parallel", type=int, default=1, metavar="N",
                   help="Ulysses sequence-parallel size (Accelerate's ParallelismConfig sp_size); checks sequence_parallel_size; "
                        "with --raw the batch is split over world / (N x tensor_parallel.autotp_size) ranks (the Trainer "
                        "counts the whole world)")
    p.add_argument("--args", metavar="JSON", help="TrainingArguments as JSON (e.g. from args.to_json_string())")
    p.add_argument("--model", help="model folder, config.json, or Hub id: compare its dtype with the config")
    p.add_argument("--host-mem", type=float, metavar="GIB",
                   help="host memory per node, for --model with an offload preset (default: this machine's)")
    p.add_argument("--cpu", action="store_true", default=None, help="check for a CPU-only machine (default: this machine)")
    p.add_argument("--raw", action="store_true", help="the config goes to DeepSpeed directly, not through the Trainer")
    p.add_argument("--no-env", action="store_true", help="skip the checks of this shell's environment")
    p.add_argument("--nvme-path", help="NVMe folder for offload to nvme")
    p.add_argument("--fix", metavar="OUT", help="write a corrected copy of the config to OUT")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(run=run, loads_deepspeed=True)
    return p


def _model_config(model) -> dict:
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return read_json_object(path, "model config")
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model, trust_remote_code=False).to_dict()  # never run a repo's code to lint
    except (OSError, ValueError):
        raise ConfigError(f"--model {model!r} is neither a folder with config.json, a config.json, nor a reachable Hub id") from None


def _meta_model(model_config: dict):
    """The model a config.json describes, on the meta device: its shapes, no weights read or allocated."""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM

    from ..model_configs import build_config

    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(build_config(model_config))
        except ValueError:  # an encoder or other non-causal architecture
            return AutoModel.from_config(build_config(model_config))


def _model_findings(config: dict, model_config: dict, args) -> list:
    """What an offload preset cannot do for this model: hf_zero.checks' checks of a model's shape (PLANNED: model
    states over the node's memory, the planner's figure; a parameter partition over zero3_nvme's swap buffer, which
    DeepSpeed refuses at zero.Init), run on the run this command plans (one node of --world-size processes, 16-bit)."""
    if not offload_devices(config):
        return []
    import psutil

    from ..checks import PLANNED, RunContext
    from ..checks.pipeline import severity_of
    from ..planner import GIB

    if args.host_mem is not None and not args.host_mem > 0:
        raise ConfigError(f"--host-mem must be a positive number of GiB, got {args.host_mem}")
    host = args.host_mem * GIB if args.host_mem else psutil.virtual_memory().total
    run = RunContext("plan", config, model=_meta_model(model_config), world=args.world_size, host_bytes=int(host))
    findings = []
    for check in PLANNED:
        for line in check.run(run):
            message, _, fix = str(line).partition(" Fix: ")
            findings.append(Finding(check.id, severity_of(line, check), message, fix))
    return findings


def print_stack(stream) -> None:
    """The installed releases of hf_zero's dependencies, each against the window CI tests."""
    from ..compat.releases import stack_report

    for package, installed, verdict in stack_report():
        print(f"  {package:<13} {installed:<14} {verdict}", file=stream)


def run(args) -> int:
    if args.config is None:
        print("installed releases (hf_zero's tested windows: docs/versions.md):")
        print_stack(sys.stdout)
        return 0
    if args.fix:
        config_file = preset_path(args.config) if is_preset_name(args.config) else args.config
        refuse_overlaps({"--fix": args.fix}, {"CONFIG": config_file, "--args": args.args,
                                              "--model": args.model if args.model and Path(args.model).exists() else None})
    for flag in ("world_size", "sequence_parallel"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    config = load_config(args.config, nvme_path=args.nvme_path)
    trainer_args = read_json_object(args.args, "--args") if args.args else None
    model_config = _model_config(args.model) if args.model else None
    on_cpu = args.cpu if args.cpu is not None else not has_gpu()
    # DeepSpeed logs to stdout; keep stdout for the report (and --json) alone.
    with contextlib.redirect_stdout(sys.stderr):
        findings = validate_config(config, on_cpu=on_cpu, world_size=args.world_size, trainer_fills_auto=not args.raw,
                                   model_config=model_config, trainer_args=trainer_args, environment=not args.no_env,
                                   sequence_parallel=args.sequence_parallel)
    if model_config is not None:
        findings += _model_findings(config, model_config, args)
    if args.json:
        print(json.dumps([f.__dict__ for f in findings], indent=2))
    elif not findings:
        print(f"{args.config}: OK")
    else:
        for f in findings:
            print(f"{args.config}: {f.severity} [{f.code}] {f.message}\n    fix: {f.fix}")
    if not args.json:
        print("installed releases (docs/versions.md):", file=sys.stderr)
        print_stack(sys.stderr)
    if args.fix:
        from ..config.rules import fix_config

        Path(args.fix).write_text(json.dumps(fix_config(config, findings), indent=2) + "\n")
        print(f"corrected copy written to {args.fix}", file=sys.stderr)
    return 1 if any(f.severity == "error" for f in findings) else 0
