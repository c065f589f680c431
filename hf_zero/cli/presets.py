"""``hf-zero presets [NAME]``: list the presets, or print / write one."""

import json
import sys
from pathlib import Path

from ..config.accelerate_yaml import accelerate_config_text, yaml_deepspeed_config
from ..config.dotted import zero_stage
from ..config.presets import (accelerate_config_path, launch_config_description, launch_config_names, load_config,
                              preset_descriptions, preset_names, preset_path)
from ..errors import ConfigError
from ..output_paths import refuse_overlaps, refuse_unwritable

# Accelerate's own config keys (accelerate config asks for them as dynamo_*)
REGIONAL_COMPILE = "dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_use_regional_compilation: true\n"
ZERO3_COMPILE_NOTE = ("note: under ZeRO-3, compile through the HF Trainer with hf_zero's ZeroCallback (hf_zero.attach), "
                      "which compiles each block's forward and keeps DeepSpeed's parameter hooks eager; a script without "
                      "it gets Accelerate's compile of the hooks too, which measured slower than eager (hf_zero's docs, performance.md)")


def add_parser(subparsers):
    p = subparsers.add_parser("presets", help="list the DeepSpeed presets, or print the path of one",
                              description="Without NAME: list the presets and the Accelerate configs. With NAME: print "
                                          "the preset's JSON path (an Accelerate config's YAML path).")
    p.add_argument("name", nargs="?", help="preset name, e.g. zero3, or an Accelerate config's, e.g. zero3_multinode "
                                           "(prints the YAML's path)")
    p.add_argument("--out", help="write the resolved config (with --nvme-path filled in) to this JSON file")
    p.add_argument("--nvme-path", help="NVMe folder for zero3_nvme")
    p.add_argument("--accelerate-config", metavar="YAML",
                   help="write the preset's Accelerate config, its DeepSpeed config inline (with --nvme-path: that "
                        "folder filled in), for accelerate launch --config_file YAML")
    p.add_argument("--torch-compile", action="store_true",
                   help="with --accelerate-config: switch on Accelerate's regional torch.compile (GPUs; the first "
                        "steps compile)")
    p.set_defaults(run=run, loads_deepspeed=True)
    return p


def with_regional_compile(yaml_text: str) -> str:
    """An Accelerate YAML with Accelerate's regional torch.compile switched on."""
    return (yaml_text.rstrip("\n") + "\n# regional torch.compile (hf-zero presets --torch-compile); the first steps "
            "compile\n" + REGIONAL_COMPILE)


def _listing() -> int:
    lines = dict(preset_descriptions())
    lines.update({name: launch_config_description(name) for name in launch_config_names()})
    width = max(map(len, lines))
    for name, line in lines.items():
        print(f"{name:<{width}}  {line}")
    print("\nUse: --deepspeed $(hf-zero presets zero3)   or   accelerate launch --config_file "
          "$(hf-zero presets zero3 --accelerate-config zero3.yaml) train.py")
    return 0


def _sources(name: str) -> tuple:
    """(the preset's JSON or None, the stored launch-only YAML or None, its DeepSpeed config's source) for a preset
    name or a launch-only YAML's name."""
    if name.removesuffix(".json") in preset_names():
        return preset_path(name), None, name
    if name.removesuffix(".yaml") in launch_config_names():
        yaml_path = accelerate_config_path(name.removesuffix(".yaml"))
        return None, yaml_path, yaml_deepspeed_config(yaml_path)
    raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(preset_names())}, or an Accelerate config: "
                      f"{', '.join(launch_config_names())} (or pass a path to a DeepSpeed JSON file)")


def _refuse_bad_flags(args) -> None:
    if args.nvme_path and not (args.out or args.accelerate_config):
        raise ValueError("--nvme-path needs --out FILE or --accelerate-config FILE to write the resolved config to")
    if args.torch_compile and not args.accelerate_config:
        raise ValueError("--torch-compile is written into an Accelerate config: add --accelerate-config FILE "
                         "(with the Trainer, pass --torch_compile to the training script instead)")


def _write_accelerate_config(args, config: dict) -> int:
    # the YAML carries the config inline, so the file works wherever it is launched from
    yaml_text = accelerate_config_text(args.name, nvme_path=args.nvme_path)
    if args.torch_compile:
        yaml_text = with_regional_compile(yaml_text)
        if zero_stage(config) == 3:
            print(ZERO3_COMPILE_NOTE, file=sys.stderr)
    Path(args.accelerate_config).write_text(yaml_text)
    print(Path(args.accelerate_config).resolve())
    return 0


def run(args) -> int:
    if args.name is None:
        return _listing()
    json_path, yaml_path, source = _sources(args.name)
    _refuse_bad_flags(args)
    refuse_overlaps({"--out": args.out, "--accelerate-config": args.accelerate_config},
                    {"the preset": json_path, "the stored Accelerate config": yaml_path})
    stem = Path(args.name).stem
    refuse_unwritable({"--out": (args.out, f"{stem}.json"), "--accelerate-config": (args.accelerate_config,
                                                                                    f"{stem}.yaml")})
    config = load_config(source, nvme_path=args.nvme_path) if args.out or args.accelerate_config else None
    if args.out:
        json_path = Path(args.out).resolve()
        json_path.write_text(json.dumps(config, indent=2) + "\n")
    if args.accelerate_config:
        return _write_accelerate_config(args, config)
    if json_path is None:  # a launch-only YAML: its path is the answer
        print(f"{args.name} is an Accelerate config: accelerate launch --config_file PATH train.py", file=sys.stderr)
        print(yaml_path)
        return 0
    print(json_path)
    return 0
