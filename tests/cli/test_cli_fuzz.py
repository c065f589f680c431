"""Fuzzing the inputs users hand hf_zero: configs, argument files, preset names, finetune flags.

Whatever the input, a tool ends in a normal report (exit 0/1) or in one clear message with exit
code 2, never in a traceback. Everything runs in-process and is bounded (a few hundred examples,
seconds) so it runs in CI.
"""

import contextlib
import io
import json
import os
import re

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from hf_zero.cli import main
from hf_zero.errors import ConfigError
from hf_zero.config.presets import get_dotted, load_config, preset_descriptions

FUZZ = settings(max_examples=int(os.environ.get("HF_ZERO_FUZZ_EXAMPLES", 60)), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# keys that matter somewhere in hf_zero or DeepSpeed, so random configs reach the rules, not just "unknown key"
KEYS = ["zero_optimization", "stage", "offload_param", "offload_optimizer", "device", "nvme_path", "pin_memory",
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
        "fp16", "bf16", "enabled", "optimizer", "type", "params", "lr", "betas", "scheduler", "reduce_bucket_size",
        "stage3_gather_16bit_weights_on_model_save", "stage3_param_persistence_threshold", "allgather_partitions",
        "sub_group_size", "gradient_checkpointing", "aio", "checkpoint", "load_universal", "per_device_train_batch_size",
        "dtype", "torch_dtype", "world_size"]
SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(min_value=-(10**40), max_value=10**40)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
           | st.sampled_from(["auto", "cpu", "nvme", "gpu", "AdamW", "bfloat16", "/nonexistent", "", "\ud800", 0, 3, -1]))
JSON = st.recursive(SCALARS, lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=5), max_leaves=25)
CONFIGS = st.dictionaries(st.sampled_from(KEYS), JSON, max_size=8)

# texts that broke or could break a JSON reader: each is an explicit example as well as random bytes
NASTY = [b"", b"   ", b"\xff\xfe\x00{", b"\xef\xbb\xbf{}", b"{\"a\": NaN}", b"{\"stage\": Infinity}", b"[" * 5000 + b"]" * 5000,
         b"{\"a\":" * 3000 + b"1" + b"}" * 3000, b"{\"train_batch_size\": " + b"9" * 5000 + b"}", b"\"\\ud800\"",
         b"{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": [1]}}}",
         b"{\"zero_optimization\": []}", b"{\"fp16\": {\"enabled\": \"auto\"}, \"train_micro_batch_size_per_gpu\": \"auto\"}",
         b"null", b"{}", b"{\"\\ud800\": 1}", b"{\"a\": 1e999}"]


def _mutate(preset, edits):
    """A shipped preset with some values replaced or deleted: close to real configs, so deep checks run."""
    config = load_config(preset)
    paths = sorted(_paths(config))
    for index, value, delete in edits:
        path = paths[index % len(paths)]
        parent, _, leaf = path.rpartition(".")
        node = get_dotted(config, parent) if parent else config
        if isinstance(node, dict) and leaf in node:
            if delete:
                del node[leaf]
            else:
                node[leaf] = value
    return config


def _paths(node, prefix=""):
    for key, value in node.items():
        yield prefix + key
        if isinstance(value, dict):
            yield from _paths(value, prefix + key + ".")


MUTATED = st.builds(_mutate, st.sampled_from(list(preset_descriptions())),
                    st.lists(st.tuples(st.integers(0, 200), JSON, st.booleans()), max_size=4))


def _dump(value) -> bytes:
    # surrogates and NaN as a careless writer would put them in a file
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


CONTENT = (st.sampled_from(NASTY) | st.binary(max_size=64) | CONFIGS.map(_dump) | MUTATED.map(_dump) | JSON.map(_dump))


@contextlib.contextmanager
def _terminal():
    """stdout/stderr as a UTF-8 terminal has them: printing text that cannot be encoded fails, as it would there."""
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def _text(stream) -> str:
    return stream.buffer.getvalue().decode("utf-8", "replace")


def _run_cli(argv) -> tuple:
    """main(argv) -> (exit code, stdout, stderr); argparse's SystemExit counts as its code."""
    with _terminal() as (out, err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, _text(out), _text(err)


def _assert_clean(code, out, err, allowed=(0, 1, 2), fuzzed=True):
    if fuzzed:  # what each example ended in, for --hypothesis-show-statistics: the fuzz must reach past the JSON reader
        message = re.sub(r"'[^']*'|\S*/\S*", "_", err.split("error: ", 1)[-1])[:40] if code == 2 else "report"
        event(f"exit {code}: {message}")
    assert code in allowed, f"exit {code!r}\n{out}\n{err}"
    assert "Traceback" not in out + err, out + err
    if code == 2:
        assert err.strip(), "exit 2 without a message"


def _write(path, content):
    if path.is_dir():
        path.rmdir()
    path.write_bytes(content)
    return path


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# --- hf-zero check -------------------------------------------------------------------------

@FUZZ
@given(content=CONTENT, args_content=st.none() | CONTENT, world_size=st.sampled_from(["1", "2", "0", "-3", "10000000000", "x"]),
       flags=st.lists(st.sampled_from(["--json", "--raw", "--cpu", "--no-env"]), unique=True))
@example(content=b"{}", args_content=None, world_size="1", flags=["--cpu"])  # quiet: a report, not an error
# the old boolean form makes DeepSpeed's parser log a deprecation warning: it must not come out as a traceback
@example(content=b'{"zero_optimization": true}', args_content=None, world_size="1", flags=[])
def test_check_never_tracebacks(scratch, content, args_content, world_size, flags):
    config = _write(scratch / "ds.json", content)
    argv = ["check", str(config), "--world-size", world_size, "--fix", str(scratch / "fixed.json"), *flags]
    if args_content is not None:
        argv += ["--args", str(_write(scratch / "args.json", args_content))]
    code, out, err = _run_cli(argv)
    _assert_clean(code, out, err)
    if code in (0, 1):
        # --fix wrote a config that is valid JSON again and that check itself reads
        fixed = json.loads((scratch / "fixed.json").read_text())
        assert isinstance(fixed, dict)


@FUZZ
@given(model_config=CONTENT)
def test_check_model_config_never_tracebacks(scratch, model_config):
    model = scratch / "model"
    model.mkdir(exist_ok=True)
    _write(model / "config.json", model_config)
    _assert_clean(*_run_cli(["check", "zero2", "--cpu", "--no-env", "--model", str(model)]))


@pytest.mark.parametrize("what", ["config", "--args", "--model"])
def test_check_directory_instead_of_a_file_exit_2(scratch, what):
    folder = scratch / "a_folder.json"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").mkdir(exist_ok=True)  # --model FOLDER reads FOLDER/config.json: a folder too
    argv = {"config": ["check", str(folder)], "--args": ["check", "zero2", "--args", str(folder)],
            "--model": ["check", "zero2", "--model", str(folder)]}[what]
    code, out, err = _run_cli(argv)
    _assert_clean(code, out, err, allowed=(2,), fuzzed=False)
    assert ("neither a folder with config.json" if what == "--model" else "is a directory") in err


# --- presets ----------------------------------------------------------------------------------

@FUZZ
@given(content=CONTENT)
def test_load_config_returns_a_dict_or_raises_config_error(scratch, content):
    path = _write(scratch / "preset.json", content)
    try:
        config = load_config(str(path))
    except ConfigError as e:
        assert str(path) in str(e)
    else:
        assert isinstance(config, dict)


def test_load_config_directory_is_a_config_error(scratch):
    folder = scratch / "dir.json"
    folder.mkdir(exist_ok=True)
    with pytest.raises(ConfigError, match="directory"):
        load_config(str(folder))


@FUZZ
@given(name=st.text(max_size=30) | st.sampled_from(list(preset_descriptions()) + ["zero3.json", "../zero3", "zero3/", "/"]),
       nvme=st.booleans())
def test_recipes_name_never_tracebacks(scratch, name, nvme):
    argv = ["presets", name] + (["--nvme-path", str(scratch), "--out", str(scratch / "r.json")] if nvme else [])
    code, out, err = _run_cli(argv)
    _assert_clean(code, out, err, allowed=(0, 2))
    if name in preset_descriptions():
        assert code == 0


# --- hf-zero finetune's argument parsing -----------------------------------------------------

FINETUNE_FLAGS = ["--task", "--max_length", "--max_train_samples", "--max_eval_samples", "--labels", "--text_column",
                  "--label_column", "--reload_check", "--gguf_file", "--messages_column", "--data",
                  "--learning_rate", "--num_train_epochs", "--max_steps", "--per_device_train_batch_size",
                  "--gradient_accumulation_steps", "--bf16", "--fp16", "--seed", "--eval_strategy", "--save_strategy",
                  "--lr_scheduler_type", "--warmup_ratio", "--logging_steps", "--report_to", "--weight_decay",
                  "--average_tokens_across_devices", "--nvme_path", "--no_such_flag"]
VALUES = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e309", "9" * 5000, "", "true", "false", "causal_lm", "chat",
                          "classification", "auto", "--", "\udcff", "epoch", "no", "a,b"]) | st.text(max_size=12)


@FUZZ
@given(recipe=CONFIGS.map(lambda c: {k: v for k, v in c.items() if not k.startswith("train_")}).map(_dump)
       | st.sampled_from([n for n in NASTY if b"train_" not in n]),
       flags=st.lists(st.tuples(st.sampled_from(FINETUNE_FLAGS), st.none() | VALUES), max_size=6))
def test_finetune_argument_parsing_never_tracebacks(scratch, tiny_models, recipe, flags):
    # The recipe never sets a batch size, so hf_zero.TrainingArguments always refuses it (batch-size-missing)
    # before any process group exists: parsing is fuzzed, training never starts.
    recipe_file = _write(scratch / "recipe.json", recipe)
    argv = ["finetune", "--model", str(tiny_models["llama"]), "--data", str(scratch / "none.csv"),
            "--preset", str(recipe_file), "--output_dir", str(scratch / "ft_out")]
    for flag, value in flags:
        argv += [flag] if value is None else [flag, value]
    code, out, err = _run_cli(argv)
    _assert_clean(code, out, err, allowed=(2,))


def test_finetune_fuzz_stays_out_of_training(scratch, tiny_models):
    # the guard the fuzz relies on: a config without a batch size stops parsing with exit 2
    recipe = _write(scratch / "recipe.json", b"{\"zero_optimization\": {\"stage\": 2}}")
    code, out, err = _run_cli(["finetune", "--model", str(tiny_models["llama"]), "--data", str(scratch / "none.csv"),
                               "--preset", str(recipe), "--output_dir", str(scratch / "ft_out")])
    assert code == 2 and "batch size" in err


# --- what the fuzzing found, pinned ----------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (b"[" * 5000 + b"]" * 5000, "nested too deeply"),  # was a RecursionError traceback from json
    (b"{\"a\":" * 40 + b"1" + b"}" * 40, "nests more than 32 levels"),  # parses, but deepcopy/rules would recurse
    (b"{\"gradient_clipping\": NaN}", "NaN is not a JSON number"),  # Python's json accepted it silently
    (b"{\"train_batch_size\": " + b"9" * 5000 + b"}", "Exceeds the limit"),  # was a bare ValueError
])
def test_check_refuses_json_python_would_choke_on(scratch, content, message):
    code, out, err = _run_cli(["check", str(_write(scratch / "ds.json", content))])
    _assert_clean(code, out, err, allowed=(2,), fuzzed=False)
    assert message in err


@pytest.mark.parametrize("nvme_path, fires", [([1], True), (7, True), ("WRITABLE", False)])
def test_nvme_path_of_the_wrong_type_is_a_finding(scratch, nvme_path, fires):
    # a list crashed os.path.isdir (TypeError traceback); an int was taken as a file descriptor
    config = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(scratch) if nvme_path == "WRITABLE" else nvme_path}}}
    code, out, err = _run_cli(["check", str(_write(scratch / "ds.json", _dump(config))), "--cpu", "--no-env", "--json"])
    _assert_clean(code, out, err, allowed=(0, 1), fuzzed=False)
    assert ("nvme-path-unusable" in out) == fires
