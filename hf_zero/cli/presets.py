"""``hf-zero presets [NAME]``: list the presets, or print / write one."""

import json
import sys
from pathlib import Path

from ..config.accelerate_yaml import inline_deepspeed_config
from ..config.presets import accelerate_config_path, load_config, preset_descriptions, preset_path

COMPILE_HINT = "# Faster on GPUs: regional torch.compile."  # the zero2 YAML's commented-out hint, replaced
# Accelerate's own config keys (accelerate config asks for them as dynamo_*)
REGIONAL_COMPILE = "dynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_use_regional_compilation: true\n"
ZERO3_COMPILE_NOTE = ("note: under ZeRO-3, compile through the HF Trainer with hf_zero's ZeroCallback (hf_zero.attach), "
                      "which compiles each block's forward and keeps DeepSpeed's parameter hooks eager; a script without "
                      "it gets Accelerate's compile of the hooks too, which measured slower than eager (hf_zero's docs, performance.md)")


def add_parser(subparsers):
    p = subparsers.add_parser("presets", help="list the DeepSpeed presets, or print the path of one",
                              description="Without NAME: list the presets. With NAME: print its JSON path.")
    p.add_argument("name", nargs="?", help="preset name, e.g. zero3")
    p.add_argument("--out", help="write the resolved config (with --nvme-path filled in) to this JSON file")
    p.add_argument("--nvme-path", help="NVMe folder for zero3_nvme")
    p.add_argument("--accelerate-config", metavar="YAML",
                   help="write a copy of the preset's Accelerate config (with --nvme-path: its DeepSpeed config "
                        "with that folder inline)")
    p.add_argument("--torch-compile", action="store_true",
                   help="with --accelerate-config: switch on Accelerate's regional torch.compile (GPUs; the first "
                        "steps compile)")
    p.set_defaults(run=run)
    return p


def with_regional_compile(yaml_text: str) -> str:
    """The preset's Accelerate YAML with regional torch.compile switched on (its commented-out hint dropped)."""
    head = yaml_text.split(COMPILE_HINT)[0]
    return head.rstrip("\n") + "\n# regional torch.compile (hf-zero presets --torch-compile); the first steps compile\n" + REGIONAL_COMPILE


def run(args) -> int:
    if args.name is None:
        descriptions = preset_descriptions()
        width = max(map(len, descriptions))
        for name, line in descriptions.items():
            print(f"{name:<{width}}  {line}")
        print("\nUse: --deepspeed $(hf-zero presets zero3)   or   accelerate launch --config_file "
              "$(hf-zero presets zero3 --accelerate-config zero3.yaml) train.py")
        return 0
    json_path = preset_path(args.name)
    if args.nvme_path and not (args.out or args.accelerate_config):
        raise ValueError("--nvme-path needs --out FILE or --accelerate-config FILE to write the resolved config to")
    config = load_config(args.name, nvme_path=args.nvme_path) if args.out or args.accelerate_config else None
    if args.out:
        json_path = Path(args.out).resolve()
        json_path.write_text(json.dumps(config, indent=2) + "\n")
    if args.torch_compile and not args.accelerate_config:
        raise ValueError("--torch-compile is written into an Accelerate config: add --accelerate-config FILE "
                         "(with the Trainer, pass --torch_compile to the training script instead)")
    if args.accelerate_config:
        # the YAML carries the config inline, so the copy works wherever it is launched from
        yaml_text = inline_deepspeed_config(accelerate_config_path(args.name).read_text(), config)
        if args.torch_compile:
            yaml_text = with_regional_compile(yaml_text)
            if config["zero_optimization"]["stage"] == 3:
                print(ZERO3_COMPILE_NOTE, file=sys.stderr)
        Path(args.accelerate_config).write_text(yaml_text)
        print(Path(args.accelerate_config).resolve())
        return 0
    print(json_path)
    return 0
