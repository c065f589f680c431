"""``hf-zero recipes [NAME]``: list the presets, or print / write one."""

import json
from pathlib import Path

from ..presets import accelerate_config_path, load_config, preset_descriptions, recipe_path


def add_parser(subparsers):
    p = subparsers.add_parser("recipes", help="list the DeepSpeed presets, or print the path of one",
                              description="Without NAME: list the presets. With NAME: print its JSON path.")
    p.add_argument("name", nargs="?", help="preset name, e.g. zero3")
    p.add_argument("--out", help="write the resolved config (with --nvme-path filled in) to this JSON file")
    p.add_argument("--nvme-path", help="NVMe folder for zero3_nvme")
    p.add_argument("--accelerate-config", metavar="YAML",
                   help="write an Accelerate config for this preset, with an absolute path to its JSON")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    if args.name is None:
        descriptions = preset_descriptions()
        width = max(map(len, descriptions))
        for name, line in descriptions.items():
            print(f"{name:<{width}}  {line}")
        print("\nUse: --deepspeed $(hf-zero recipes zero3)   or   accelerate launch --config_file "
              "recipes/accelerate/zero3.yaml train.py")
        return 0
    path = recipe_path(args.name)
    json_path = path
    if args.out or args.nvme_path:
        if not args.out:
            raise ValueError("--nvme-path needs --out FILE to write the resolved config to")
        config = load_config(args.name, nvme_path=args.nvme_path)
        json_path = Path(args.out).resolve()
        json_path.write_text(json.dumps(config, indent=2) + "\n")
    if args.accelerate_config:
        yaml_text = accelerate_config_path(args.name).read_text()
        yaml_text = yaml_text.replace(f"recipes/{path.name}", str(json_path))
        Path(args.accelerate_config).write_text(yaml_text)
        print(Path(args.accelerate_config).resolve())
        return 0
    print(json_path)
    return 0
