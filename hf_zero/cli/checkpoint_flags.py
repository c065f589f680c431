"""Flags of the subcommands that read checkpoints (export, verify): the same words and the same meaning."""


def add_checkpoint_flags(p, json_help: str) -> None:
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="load pickles that import code outside the allow-list (only for checkpoints you trust)")
    p.add_argument("--json", action="store_true", help=json_help)
