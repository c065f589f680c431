"""Data and metrics for `hf-zero finetune`: local tables to tokenized datasets."""
