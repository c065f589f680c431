"""What `hf-zero finetune` takes beyond the Trainer's own arguments."""

from dataclasses import dataclass, field

# the argument parser alone: --help is answered without loading torch
from transformers.hf_argparser import HfArgumentParser

DESCRIPTION = "Fine-tune a pretrained model under DeepSpeed ZeRO with the HF Trainer."


@dataclass
class FinetuneArguments:
    model: str = field(metadata={"help": "Hub id or local folder of the pretrained model"})
    data: str = field(metadata={"help": "local csv/json/jsonl/txt file(s) (globs allowed) or a `datasets` name"})
    task: str = field(default="classification", metadata={"help": "classification, causal_lm or chat"})
    preset: str | None = field(default=None, metadata={"help": "hf_zero preset or DeepSpeed JSON (default: zero3 on CPU "
                                                               "and for models too big for one GPU, else zero2)"})
    text_column: str = field(default="text", metadata={"help": "column with the text"})
    label_column: str = field(default="label", metadata={"help": "column with the class label (classification)"})
    labels: str | None = field(default=None, metadata={"help": "comma-separated labels to keep, in id order"})
    messages_column: str = field(default="messages", metadata={"help": "column with chat messages (chat)"})
    max_length: int = field(default=128, metadata={"help": "tokens per example (block size for causal_lm)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only this many training rows"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only this many evaluation rows"})
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside --model (de-quantised)"})
    reload_check: bool = field(default=True, metadata={"help": "reload the saved model in a fresh process and evaluate it"})
    lora_r: int = field(default=0, metadata={"help": "LoRA rank (peft); 0 (default) fine-tunes every weight. The run "
                                                         "saves the adapter in OUTPUT_DIR/adapter and the merged model in "
                                                         "OUTPUT_DIR/final"})
    lora_alpha: int | None = field(default=None, metadata={"help": "LoRA scaling alpha (default: 2 x lora_r)"})
    lora_dropout: float = field(default=0.0, metadata={"help": "dropout on the LoRA branch"})
    lora_target_modules: str = field(default="all-linear", metadata={"help": "comma-separated module names to adapt, "
                                                                             "or all-linear"})
    long_context: bool = field(default=False, metadata={"help": "long sequences (causal_lm, chat): tiled MLP, fused "
                                                                "loss, checkpointed layer inputs on the host "
                                                                "(hf_zero docs: long-context.md)"})
    trust_remote_code: bool = field(default=False, metadata={"help": "run the Python code a model folder or Hub repo ships "
                                                                     "(auto_map); only for sources you trust"})

    def __post_init__(self):
        if self.task not in ("classification", "causal_lm", "chat"):
            raise ValueError(f"--task {self.task!r} is not one of classification, causal_lm, chat")
        for name in ("max_length", "max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name} must be a positive number, got {value}")
        if self.long_context and self.task == "classification":
            raise ValueError("--long_context trains causal LMs (--task causal_lm or chat): its fused loss replaces "
                             "the LM head's logits, which a classifier does not have")
        if self.lora_r < 0:
            raise ValueError(f"--lora_r must be 0 (full fine-tune) or a positive rank, got {self.lora_r}")
        if self.lora_alpha is not None and self.lora_alpha <= 0:
            raise ValueError(f"--lora_alpha must be positive, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.lora_r:
            from importlib.util import find_spec

            if find_spec("peft") is None:
                raise ValueError("--lora_r needs peft, which is not installed: pip install 'hf_zero[peft]' "
                                 "(or pip install peft)")


def finetune_parser() -> HfArgumentParser:
    """The parser of hf-zero finetune's own flags; the rest go to TrainingArguments."""
    return HfArgumentParser(FinetuneArguments, prog="hf-zero finetune", description=DESCRIPTION,
                            epilog="Every transformers TrainingArguments flag (--learning_rate, --num_train_epochs, "
                                   "--bf16, --gradient_checkpointing, --output_dir, ...) is accepted too.")
