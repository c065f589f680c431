"""What `hf-zero finetune` takes beyond the Trainer's own arguments."""

from dataclasses import dataclass, field


@dataclass
class FinetuneArguments:
    model: str = field(metadata={"help": "Hub id or local folder of the pretrained model"})
    data: str = field(metadata={"help": "local csv/json/jsonl/txt file(s) (globs allowed) or a `datasets` name"})
    task: str = field(default="classification", metadata={"help": "classification, causal_lm or chat"})
    recipe: str | None = field(default=None, metadata={"help": "hf_zero preset or DeepSpeed JSON (default: zero3 "
                                                                "on CPU and for models too big for one GPU, else zero2)"})
    text_column: str = field(default="text", metadata={"help": "column with the text"})
    label_column: str = field(default="label", metadata={"help": "column with the class label (classification)"})
    labels: str | None = field(default=None, metadata={"help": "comma-separated labels to keep, in id order"})
    messages_column: str = field(default="messages", metadata={"help": "column with chat messages (chat)"})
    max_length: int = field(default=128, metadata={"help": "tokens per example (block size for causal_lm)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only this many training rows"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only this many evaluation rows"})
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside --model (de-quantised)"})
    reload_check: bool = field(default=True, metadata={"help": "reload the saved model in a fresh process and evaluate it"})
    trust_remote_code: bool = field(default=False, metadata={"help": "run the Python code a model folder or Hub repo ships "
                                                                     "(auto_map); only for sources you trust"})

    def __post_init__(self):
        if self.task not in ("classification", "causal_lm", "chat"):
            raise ValueError(f"--task {self.task!r} is not one of classification, causal_lm, chat")
        for name in ("max_length", "max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name} must be a positive number, got {value}")
