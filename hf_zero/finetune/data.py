"""Turn a local file (or a `datasets` name) into tokenized train/validation splits.

Three tasks: sequence classification, causal LM on plain text, and chat SFT.
Every user mistake we can foresee raises ValueError with one line saying what is
wrong and how to fix it, before any training starts.
"""

import glob
import os
from itertools import chain
from pathlib import Path

import datasets
from datasets import ClassLabel, DatasetDict

IGNORE_INDEX = -100  # label value that torch's cross-entropy (and so every HF model) skips

# Builder for each file type we document; compressed variants (.csv.bz2, .jsonl.gz)
# are decompressed by `datasets` itself, so only the suffix in front counts.
_BUILDERS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"sep": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".txt": ("text", {}),
    ".text": ("text", {}),
    ".parquet": ("parquet", {}),
}
_COMPRESSIONS = {".bz2", ".gz", ".xz", ".zst", ".lz4"}


def _file_type(path):
    suffixes = [s.lower() for s in Path(path).suffixes]
    while suffixes and suffixes[-1] in _COMPRESSIONS:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def load_table(data, split_ratio=0.2, seed=0):
    """Load `data` (file, glob, folder or `datasets` name) as a DatasetDict with "train" and "validation"."""
    kind = _file_type(data)
    if kind in _BUILDERS:
        files = sorted(glob.glob(data))
        if not files:
            raise ValueError(f"no file matches {data!r}; check the path (globs like 'data/*.csv' are allowed)")
        _refuse_empty_files(files)
        builder, options = _BUILDERS[kind]
        try:
            dsd = datasets.load_dataset(builder, data_files=data, **options)
        except ValueError as err:
            # What `datasets` says for a file with no rows: 'Instruction "train" corresponds to no data!'
            if "no data" not in str(err):
                raise
            raise ValueError(f"{data!r} has no rows; check the data file") from None
    elif os.path.isfile(data):
        raise ValueError(f"can't tell the format of {data!r}; use one of: {', '.join(sorted(_BUILDERS))}")
    else:
        # A folder of data files or a dataset name; `datasets` explains its own failures.
        dsd = datasets.load_dataset(data)

    if "train" not in dsd:
        raise ValueError(f"{data!r} has no 'train' split (splits: {', '.join(dsd)}); rename the split or file to train")
    _require_rows(DatasetDict(train=dsd["train"]), data)
    held_out = dsd.get("validation", dsd.get("test"))
    if held_out is None:
        parts = dsd["train"].train_test_split(test_size=split_ratio, seed=seed)
        return DatasetDict(train=parts["train"], validation=parts["test"])
    return DatasetDict(train=dsd["train"], validation=held_out)


def _refuse_empty_files(files):
    """`datasets` ends an empty .json/.jsonl in a bare StopIteration and an empty .csv in DatasetGenerationError."""
    for name in files:
        path = Path(name)
        # whitespace only is empty too; a large file is not read (it holds something), nor a compressed one
        if path.is_file() and (path.stat().st_size == 0 or (
                path.stat().st_size <= 4096 and _file_type(path) == path.suffix.lower() and not path.read_bytes().strip())):
            raise ValueError(f"{name!r} holds no rows (the file is empty); put the data in it, or leave it out of --data")


def _require_columns(dsd, *columns, hint=""):
    for split, ds in dsd.items():
        missing = [c for c in columns if c not in ds.column_names]
        if missing:
            raise ValueError(
                f"column {missing[0]!r} not found in split {split!r}; its columns are: "
                f"{', '.join(ds.column_names)}{hint}"
            )


def _require_rows(dsd, what="the data"):
    for split, ds in dsd.items():
        if ds.num_rows == 0:
            raise ValueError(f"split {split!r} of {what} has no rows; check the data file and any label filter")


def prepare_classification(dsd, tokenizer, text_column="text", label_column="label", max_length=128, labels=None):
    """Tokenize text and encode labels as ids. Returns (tokenized DatasetDict, label names).

    String labels become ids in sorted order, or in the order of `labels`, which also
    drops rows with any other label. Int labels are kept; `labels` then names ids 0..n-1.
    """
    _require_columns(dsd, text_column, label_column, hint="; pick them with text_column= and label_column=")
    _require_rows(dsd)
    if isinstance(labels, str):
        labels = [name.strip() for name in labels.split(",") if name.strip()]
    # Rows without text or label can't be trained on, and None breaks sorting the label names.
    dsd = dsd.filter(lambda row: row[text_column] is not None and row[label_column] is not None)
    dsd, label_names = _encode_labels(dsd, label_column, labels)
    _require_rows(dsd)

    def tokenize(batch):
        return tokenizer(batch[text_column], truncation=True, max_length=max_length)

    tokenized = DatasetDict(
        {
            split: ds.map(tokenize, batched=True, remove_columns=[c for c in ds.column_names if c != label_column])
            for split, ds in dsd.items()
        }
    )
    return tokenized.rename_column(label_column, "labels"), label_names


def _encode_labels(dsd, column, labels):
    feature = dsd["train"].features[column]
    if isinstance(feature, ClassLabel):
        if labels is None:
            return dsd, list(feature.names)
        # Go through the names so a user's subset/order applies like for string labels
        # (a plain cast to string would give "0", "1", ... instead of the names).
        features = dsd["train"].features.copy()
        features[column] = datasets.Value("string")
        dsd = dsd.map(lambda batch: {column: feature.int2str(batch[column])}, batched=True, features=features)
    elif getattr(feature, "dtype", "").startswith(("int", "uint")):
        top = max(max(ds.unique(column)) for ds in dsd.values())
        names = list(labels) if labels else [str(i) for i in range(top + 1)]
        if top >= len(names) or min(min(ds.unique(column)) for ds in dsd.values()) < 0:
            raise ValueError(
                f"label ids must be in 0..{len(names) - 1} for {len(names)} label names, found id {top}; "
                f"give one name per id with labels="
            )
        return dsd, names
    elif getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise ValueError(f"label column {column!r} holds {feature}; it must hold class names or int ids")

    found = sorted(set(chain.from_iterable(ds.unique(column) for ds in dsd.values())))
    if labels:
        unknown = [name for name in labels if name not in found]
        if unknown:
            raise ValueError(
                f"label {unknown[0]!r} never occurs in column {column!r}; labels found: {', '.join(found)}"
            )
        wanted = set(labels)
        dsd = dsd.filter(lambda row: row[column] in wanted)
    names = list(labels) if labels else found
    # `datasets` maps each string to its index in `names` when casting to ClassLabel.
    return dsd.cast_column(column, ClassLabel(names=names)), names


def check_num_labels(model_config, label_names):
    """Fail early when the classification head size differs from the number of labels in the data."""
    if model_config.num_labels != len(label_names):
        raise ValueError(
            f"the model has num_labels={model_config.num_labels} but the data has {len(label_names)} labels "
            f"({', '.join(map(str, label_names))}); load the model with num_labels={len(label_names)} "
            f"or keep only {model_config.num_labels} labels with labels="
        )


def label_config(label_names):
    """from_pretrained(...) kwargs so the saved model reports class names, not LABEL_0/LABEL_1."""
    return {
        "num_labels": len(label_names),
        "id2label": dict(enumerate(label_names)),
        "label2id": {name: i for i, name in enumerate(label_names)},
    }


def prepare_causal_lm(dsd, tokenizer, text_column="text", block_size=128):
    """Tokenize plain text, concatenate it and cut it into blocks of `block_size` tokens; labels = input_ids."""
    _require_columns(dsd, text_column, hint="; pick one with text_column=")
    # Text files give one row per line, blank lines included: they carry nothing to learn.
    dsd = dsd.filter(lambda row: bool(row[text_column] and row[text_column].strip()))
    _require_rows(dsd)
    # An EOS between documents keeps the model from learning that one text runs into the next.
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def tokenize(batch):
        return {"input_ids": [ids + eos for ids in tokenizer(batch[text_column])["input_ids"]]}

    def group(batch):
        ids = list(chain.from_iterable(batch["input_ids"]))
        # Drops the tail shorter than a block, as the transformers run_clm example does.
        blocks = [ids[i : i + block_size] for i in range(0, len(ids) - block_size + 1, block_size)]
        return {"input_ids": blocks, "attention_mask": [[1] * block_size for _ in blocks], "labels": blocks}

    blocks = DatasetDict(
        {
            split: ds.map(tokenize, batched=True, remove_columns=ds.column_names).map(group, batched=True)
            for split, ds in dsd.items()
        }
    )
    for split, ds in blocks.items():
        if ds.num_rows == 0:
            raise ValueError(f"split {split!r} has fewer than block_size={block_size} tokens; lower block_size")
    return blocks


def prepare_chat(
    dsd, tokenizer, messages_column="messages", max_length=256, prompt_column="prompt", response_column="response"
):
    """Tokenize conversations with the tokenizer's chat template; only assistant tokens get labels.

    Rows hold a list of {"role", "content"} messages, or a prompt and a response column
    that become a one-turn conversation.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template; use an instruct/chat model or set tokenizer.chat_template"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("chat data needs a fast tokenizer (for token offsets); load it with use_fast=True")
    columns = dsd["train"].column_names
    if messages_column not in columns and {prompt_column, response_column} <= set(columns):

        def to_messages(row):
            return [
                {"role": "user", "content": row[prompt_column]},
                {"role": "assistant", "content": row[response_column]},
            ]

    else:
        _require_columns(
            dsd,
            messages_column,
            hint=f"; pick it with messages_column=, or give {prompt_column}/{response_column} columns",
        )

        def to_messages(row):
            return row[messages_column]

    _require_rows(dsd)

    def encode(row):
        return _encode_conversation(_check_messages(to_messages(row)), tokenizer, max_length)

    encoded = DatasetDict({split: ds.map(encode, remove_columns=ds.column_names) for split, ds in dsd.items()})
    # Rows whose answers were cut off by max_length (or that have no answer) would add a zero-token loss.
    encoded = encoded.filter(lambda row: any(label != IGNORE_INDEX for label in row["labels"]))
    for split, ds in encoded.items():
        if ds.num_rows == 0:
            raise ValueError(f"no row of split {split!r} has an assistant answer within max_length={max_length}")
    return encoded


def _check_messages(messages):
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m and "content" in m for m in messages
    ):
        raise ValueError(
            f"a conversation must be a list of {{'role': ..., 'content': ...}} dicts, got {messages!r:.200}"
        )
    return messages


def _encode_conversation(messages, tokenizer, max_length):
    def render(turns, **kwargs):
        return tokenizer.apply_chat_template(turns, tokenize=False, **kwargs)

    text = render(messages)
    # Character span of each assistant answer: from the end of the prompt that asks for it
    # (generation prompt included) to the end of the conversation rendered up to it.
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i == 0:
            continue
        prompt, upto = render(messages[:i], add_generation_prompt=True), render(messages[: i + 1])
        if not (text.startswith(prompt) and text.startswith(upto) and len(prompt) <= len(upto)):
            raise ValueError(
                "the chat template renders earlier turns differently once later turns follow "
                "(e.g. it drops past reasoning), so answer tokens can't be located; split such "
                "conversations into one row per assistant turn"
            )
        spans.append((len(prompt), len(upto)))

    # The template already wrote any BOS/EOS text, so the tokenizer must not add them again.
    enc = tokenizer(text, add_special_tokens=False, truncation=True, max_length=max_length, return_offsets_mapping=True)
    offsets = enc.pop("offset_mapping")
    enc["labels"] = [
        token if any(start <= begin < end for start, end in spans) else IGNORE_INDEX
        for token, (begin, _) in zip(enc["input_ids"], offsets, strict=True)
    ]
    return dict(enc)


def data_collator(task, tokenizer, pad_to_multiple_of=None):
    """The transformers collator for a task ("classification", "causal_lm" or "chat"); padded batches are
    rounded up to ``pad_to_multiple_of`` tokens (hf_zero.batch_padding.GPU_PAD_MULTIPLE on GPUs, measured faster)."""
    from transformers import DataCollatorForSeq2Seq, DataCollatorWithPadding, default_data_collator

    if task == "causal_lm":
        return default_data_collator  # blocks all have block_size tokens: nothing to pad
    if tokenizer.pad_token is None:
        # Decoder-only tokenizers often have no pad token; padded positions are masked out
        # (attention_mask 0, label -100), so reusing EOS is harmless.
        tokenizer.pad_token = tokenizer.eos_token
    if task == "classification":
        return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)
    if task == "chat":
        return DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, padding=True,
                                      pad_to_multiple_of=pad_to_multiple_of)
    raise ValueError(f"unknown task {task!r}; use classification, causal_lm or chat")
