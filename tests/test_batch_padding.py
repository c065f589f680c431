"""The GPU padding advice: fires for a collator that pads to the longest sample on a GPU, quiet otherwise."""

from transformers import DataCollatorForSeq2Seq, DataCollatorWithPadding, default_data_collator

from hf_zero.batch_padding import GPU_PAD_MULTIPLE, padding_advice

from conftest import build_tiny_tokenizer


def test_advice_fires_for_padding_to_the_longest_sample_on_a_gpu():
    tokenizer = build_tiny_tokenizer()
    for collator in (DataCollatorWithPadding(tokenizer), DataCollatorForSeq2Seq(tokenizer, padding=True)):
        advice = padding_advice(collator, on_gpu=True)
        assert advice and f"pad_to_multiple_of={GPU_PAD_MULTIPLE}" in advice and type(collator).__name__ in advice


def test_advice_is_quiet_where_padding_is_already_right_or_alignment_buys_nothing():
    tokenizer = build_tiny_tokenizer()
    assert padding_advice(DataCollatorWithPadding(tokenizer), on_gpu=False) is None  # CPU
    assert padding_advice(DataCollatorWithPadding(tokenizer, pad_to_multiple_of=64), on_gpu=True) is None
    assert padding_advice(DataCollatorWithPadding(tokenizer, padding="max_length", max_length=128), on_gpu=True) is None
    assert padding_advice(default_data_collator, on_gpu=True) is None  # fixed-length blocks: nothing padded
    assert padding_advice(None, on_gpu=True) is None
