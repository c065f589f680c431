"""Data and metrics for `hf-zero finetune`: local tables to tokenized datasets."""

__all__ = []  # a command (hf-zero finetune); its modules are imported by name
