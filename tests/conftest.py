"""Shared fixtures: tiny models built from a config, and launching DeepSpeed workers for real."""

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

# DeepSpeed's logger binds its handler to whatever sys.stdout is when deepspeed is first imported.
# Imported inside a test that captures output (capsys, redirect_stdout), it kept writing to that
# test's closed stream later and printed "--- Logging error --- Traceback" into another test's
# output (a fuzz example with an old-style "zero_optimization": true). Import it here, once, while
# stdout is the session's.
import deepspeed.utils.logging  # noqa: E402,F401  (imported for that side effect)

import deprecation_guard  # noqa: F401  (fails a test where hf_zero calls a deprecated API)
from hf_zero.distributed import free_port
from hf_zero.compat.releases import installed_version

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORKER = REPO / "tests" / "workers" / "train_tiny.py"


# ---- releases ---------------------------------------------------------------------------------------------------
def pytest_runtest_setup(item):
    """``@pytest.mark.requires("deepspeed>=0.19.3")``: a test of what only that release (or newer) has, skipped in an
    environment with an older one (the floor environment) with the release named."""
    for marker in item.iter_markers("requires"):
        for spec in marker.args:
            requirement = Requirement(spec)
            installed = installed_version(requirement.name)
            if installed is None or installed not in requirement.specifier:
                pytest.skip(f"needs {spec} ({requirement.name} {installed or 'not installed'} here)")


def worker_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(
        # DeepSpeed's compiled ops (shm_comm, FusedAdam, cpu_adam, async_io) are kept with the venv
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions")),
        # one thread per rank on 2 cores; a run that sets it (the kernel checks of docs/development.md) keeps its own
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        # tests/ for deprecation_guard, which every worker imports
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH")])),
    )
    env.update(extra)
    return env


def launcher_script(name: str) -> str:
    """A launcher script (deepspeed, accelerate): beside this Python, or on PATH (a GPU image's --target install)."""
    return shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")


@functools.cache
def _accelerate_configs() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="hf_zero-accelerate-configs-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def accelerate_config_file(name_or_path: str) -> str:
    """The Accelerate YAML for ``accelerate:NAME``: a YAML file's path as given, or the Accelerate config of the preset
    (or launch-only config) NAME, written as ``hf-zero presets NAME --accelerate-config FILE`` writes it."""
    import hf_zero

    if name_or_path.endswith(".yaml"):
        return name_or_path
    path = _accelerate_configs() / f"{name_or_path}.yaml"
    path.write_text(hf_zero.accelerate_config_text(name_or_path))
    return str(path)


def launch_command(launcher: str, nproc: int, script_args: list, script: Path = WORKER) -> list:
    port = str(free_port())
    if launcher == "python":
        assert nproc == 1
        return [sys.executable, str(script), *script_args]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                "--master_port", port, str(script), *script_args]
    if launcher == "deepspeed":
        return [launcher_script("deepspeed"), "--num_gpus", str(nproc), "--master_port", port, str(script), *script_args]
    if launcher.startswith("accelerate:"):
        yaml = accelerate_config_file(launcher.split(":", 1)[1])
        return [launcher_script("accelerate"), "launch", "--config_file", yaml, "--num_processes", str(nproc),
                "--main_process_port", port, str(script), *script_args]
    raise ValueError(launcher)


def missing(what: str, install: str):
    """A test's requirement that this machine lacks: skipped on a developer's machine, a failure under CI
    (.ci/run exports HF_ZERO_CI=1), which installs everything such tests need. Not for the test extra's
    packages (peft, datasets, evaluate): make test installs those, so the tests import them plainly."""
    message = f"{what} is missing ({install})"
    if os.environ.get("HF_ZERO_CI"):
        pytest.fail(f"CI must have it: {message}", pytrace=False)
    pytest.skip(message)


# The test workers print this after hf_zero.shutdown(), as the last thing they do.
FINISHED = "hf_zero-test: worker finished"


def aborted_after_finishing(proc) -> bool:
    """Every rank finished its work, and one then died in interpreter teardown with Gloo's rare
    'terminate called without an active exception' (torch's C++ threads outliving Python). The run's
    results are complete; a retry would not be the same run (resume tests change their folder).
    One FINISHED line is enough: hf_zero.shutdown() returns on a rank only once every rank has arrived
    in it, so every rank's work was done, and the launcher may kill the others (SIGTERM) as soon as
    the aborted one exits, before they print."""
    return finished_then_aborted(proc.returncode, proc.stdout, proc.stderr)


def finished_then_aborted(returncode: int, stdout: str, stderr: str) -> bool:
    """aborted_after_finishing for a launch whose output the test reads itself (stderr may be folded into stdout)."""
    return (returncode != 0 and stdout.count(FINISHED) >= 1
            and "terminate called without an active exception" in stderr)


def run_nodes(commands: list, *, cwd, timeout: float = 600, grace: float = 30) -> list:
    """Start one launcher per "node" (each running one rank) together and wait for all; fail with every node's output
    unless each node exited 0 or its rank finished (FINISHED) before Gloo's teardown abort. After such an abort the
    other launchers would wait out torchelastic's 300 s exit barrier, so a node still running ``grace`` seconds after
    another exited is stopped, and passes if its rank finished. A node that fails outright stops the others at once
    (they would wait at the rendezvous until ``timeout``)."""
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    procs = [subprocess.Popen(cmd, cwd=cwd, env=worker_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
             for cmd, log in zip(commands, logs)]

    def output(i):
        logs[i].seek(0)
        return logs[i].read()

    deadline, stopped = time.monotonic() + timeout, set()
    while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
        exited = [i for i, proc in enumerate(procs) if proc.returncode is not None]
        if any(procs[i].returncode != 0 and FINISHED not in output(i) for i in exited):
            break  # a real failure
        if exited:
            deadline = min(deadline, time.monotonic() + grace)
        time.sleep(1)
    for i, proc in enumerate(procs):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            stopped.add(i)
    outputs = [output(i) for i in range(len(procs))]
    ok = [proc.returncode == 0 or (FINISHED in out and (i in stopped or finished_then_aborted(proc.returncode, out, out)))
          for i, (proc, out) in enumerate(zip(procs, outputs))]
    if not all(ok):
        shown = "\n".join(f"--- node {i} (exit {proc.returncode}{', stopped' if i in stopped else ''}) ---\n{out[-6000:]}"
                          for i, (proc, out) in enumerate(zip(procs, outputs)))
        pytest.fail(f"{len(procs)} nodes: not every one finished:\n{shown}")
    return outputs


def run_worker(script_args, *, nproc=1, launcher=None, expect_fail=False, env=None, timeout=900, script=WORKER, cwd=REPO):
    """Run the worker (in ``cwd``, the checkout unless given); on an unexpected exit code fail with the workers' output,
    not just the code."""
    launcher = launcher or ("python" if nproc == 1 else "torchrun")
    cmd = launch_command(launcher, nproc, [str(a) for a in script_args], script)
    proc = subprocess.run(cmd, cwd=cwd, env=worker_env(**(env or {})), capture_output=True, text=True, timeout=timeout)
    failed = proc.returncode != 0 and not aborted_after_finishing(proc)
    if failed != expect_fail:
        tail = (proc.stdout[-4000:] + "\n--- stderr ---\n" + proc.stderr[-8000:])
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode} (expected {'failure' if expect_fail else 'success'}):\n{tail}")
    return proc


LORA_WORKER = REPO / "tests" / "workers" / "train_lora.py"


def run_lora(model_path, out, *flags, nproc=2, env=None):
    """Launch the LoRA worker (torchrun for 2 processes, plain python for 1); fail with its output."""
    run_worker(["--model", model_path, "--out", out, "--persistence-threshold", "0", *flags], nproc=nproc, env=env,
               timeout=600, script=LORA_WORKER)
    return read_result(out)


def read_result(out: Path) -> dict:
    return json.loads((Path(out) / "result.json").read_text())


def assert_reload_bitwise(out: Path, model_class_name="AutoModelForCausalLM", folder="final"):
    """from_pretrained(out/folder) in this clean process holds exactly the engine's gathered weights (at the end)."""
    import torch
    import transformers
    from safetensors.torch import load_file

    expected = load_file(str(Path(out) / "expected.safetensors"))
    model = getattr(transformers, model_class_name).from_pretrained(str(Path(out) / folder), dtype="auto")
    reloaded = model.state_dict()
    assert expected, "no gathered weights were written"
    for name, tensor in expected.items():
        assert name in reloaded, f"{name} missing after reload"
        got = reloaded[name]
        assert got.dtype == tensor.dtype, f"{name}: dtype {got.dtype} != {tensor.dtype}"
        assert got.shape == tensor.shape, f"{name}: shape {tuple(got.shape)} != {tuple(tensor.shape)}"
        assert torch.equal(got, tensor), f"{name}: max diff {(got.float() - tensor.float()).abs().max()}"
    return model


# ---- two code paths that compute the same training -------------------------------------------------------------
# Two code paths that train the same model on the same data (ZeRO-3 leaves or none, checkpointing or not, reentrant or
# not, a long-context part or plain checkpointing, one node or two) run their floating-point operations with other
# kernels or in another order, so their losses agree only to rounding, and how closely depends on the CPU's kernels
# (AVX-512, AVX2 or the scalar default: ATEN_CPU_CAPABILITY) and its threads. Measured on the tiny models' 3-6 step
# runs (HF_ZERO_NOISE_LOG; docs/development.md, "Exactness across machines"): at most 9e-8 relative between two such
# paths, on an AMD EPYC with its AVX-512 kernels, with ATEN_CPU_CAPABILITY=avx2 and =default and OMP_NUM_THREADS 1
# and 2, and on an AVX-512 Xeon (leaves against no leaves: 5.256528854 and 5.256529331). The smallest defect tried
# moves them by 1e-4: one 64x64 weight of a ZeRO-3 leaf whose gradient is lost (tests/checks/test_doors.py, seen
# red). The tolerance sits between the two, 100x above the noise and 10x below that defect.
PATHS_REL = 1e-5
# The same for the weights the runs end with, per tensor, as the norm of the difference over the norm of the tensor:
# Adam divides each gradient entry by its own scale, so an entry whose gradient is at rounding level can move by a
# whole step on one path and not the other; over a tensor that stays small. Measured at most 7.6e-7 on the machines
# above (a LoRA adapter trained with and without decoder-layer leaves); a run that skips one of its six steps is
# about 5e-2 away (the tiny models' weights are about 0.02, a step moves each by
# up to 1e-3; a LoRA B matrix starts at 0, so all of it is steps).
PATHS_WEIGHTS_REL = 1e-3


def assert_same_losses(got, want, what: str, rel: float = PATHS_REL):
    """``got`` and ``want`` (the losses of two code paths of one training) agree within ``rel``. HF_ZERO_NOISE_LOG=FILE
    appends each comparison to FILE (one JSON line), which is how the noise floor above is measured."""
    if os.environ.get("HF_ZERO_NOISE_LOG"):
        worst = max((abs(a - b) / abs(b) for a, b in zip(got, want) if b), default=0.0)
        with open(os.environ["HF_ZERO_NOISE_LOG"], "a") as log:
            log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], "what": what,
                                  "worst_rel": worst, "got": list(got), "want": list(want)}) + "\n")
    assert len(got) == len(want) and got == pytest.approx(want, rel=rel, abs=0), f"{what}: {got} != {want} (rel {rel})"


def differing_tensors(a_path, b_path) -> dict:
    """The tensors whose bits differ between two safetensors files (name -> max abs difference); {} when every tensor
    is the same. Both files must hold tensors, under the same names."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(a_path)), load_file(str(b_path))
    assert a and set(a) == set(b)
    return {name: (a[name].float() - b[name].float()).abs().max().item()
            for name in a if not torch.equal(a[name], b[name])}


def assert_same_weights(a_path, b_path, rel: float = PATHS_WEIGHTS_REL):
    """The weights two code paths of one training end with (safetensors files, the same names) agree: per tensor, the
    norm of their difference is at most ``rel`` of the tensor's norm (PATHS_WEIGHTS_REL says why a norm)."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(a_path)), load_file(str(b_path))
    assert a and set(a) == set(b)
    off = {name: ((a[name].double() - b[name].double()).norm() / b[name].double().norm().clamp_min(1e-30)).item()
           for name in a}
    worst = max(off.values())
    if os.environ.get("HF_ZERO_NOISE_LOG"):
        with open(os.environ["HF_ZERO_NOISE_LOG"], "a") as log:
            log.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], "what": "weights",
                                  "worst_rel": worst}) + "\n")
    assert worst <= rel, {name: value for name, value in off.items() if value > rel}


def assert_trained(out: Path, initial: Path, min_drop: float = 0.1):
    """The run trained: every weight the engine ends with differs from the model it started from, and the loss
    fell over the run's few steps (the workers' data is learnable: 16 distinct tokens, ~5.54 -> ~5.31 in 4 steps
    at lr 1e-3). An optimizer that never steps fails both; "no NaN" would pass it."""
    import torch
    from safetensors.torch import load_file

    result = read_result(out)
    losses = result["losses"]
    assert losses[-1] < losses[0] - min_drop, f"the loss did not fall: {losses}"
    start = load_file(str(Path(initial) / "model.safetensors"))
    end = load_file(str(Path(out) / "expected.safetensors"))
    unmoved = [name for name, tensor in end.items() if name in start and torch.equal(start[name], tensor.to(start[name].dtype))]
    assert set(end) & set(start), "no weight of the initial model is in the trained one"
    assert not unmoved, f"weights that never moved: {unmoved}"
    return result


SENTENCES = [
    "the movie was great and the cast was fine",
    "a dull plot with bad acting",
    "user assistant system hello how are you i am fine thanks",
    "what is two plus two it is four",
]
SPECIAL = ["<pad>", "<unk>", "<eos>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer():
    """A word-level fast tokenizer with a ChatML-style template, trained offline on SENTENCES."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=SPECIAL))
    tok.add_special_tokens(SPECIAL)  # split out before pre-tokenization, skipped by decode
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Random-init Llama, GPT-2 (causal LM) and BERT (classifier), hidden 64, saved once per session."""
    import torch
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, BertConfig, GPT2Config,
                              LlamaConfig)

    root = tmp_path_factory.mktemp("tiny_models")
    torch.manual_seed(0)
    configs = {
        "llama": (AutoModelForCausalLM, LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                    num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                                    max_position_embeddings=64)),
        "gpt2": (AutoModelForCausalLM, GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)),
        "bert": (AutoModelForSequenceClassification, BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                                intermediate_size=128, vocab_size=256, num_labels=2,
                                                                max_position_embeddings=64)),
    }
    paths = {}
    for name, (cls, config) in configs.items():
        paths[name] = root / name
        cls.from_config(config).save_pretrained(paths[name])
    # a causal LM with a real (tiny) tokenizer saved beside it, as hf-zero finetune expects
    tokenizer = build_tiny_tokenizer()
    paths["llama_tok"] = root / "llama_tok"
    AutoModelForCausalLM.from_config(LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=len(tokenizer), max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None)).save_pretrained(paths["llama_tok"])
    tokenizer.save_pretrained(paths["llama_tok"])
    # a classifier whose head already has 3 labels, for the label-count check
    paths["bert3"] = root / "bert3"
    AutoModelForSequenceClassification.from_config(BertConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, vocab_size=len(tokenizer),
        num_labels=3, architectures=["BertForSequenceClassification"])).save_pretrained(paths["bert3"])
    tokenizer.save_pretrained(paths["bert3"])
    return paths


@pytest.fixture(scope="session")
def trained(tiny_models, tmp_path_factory):
    """Run a worker once per distinct setting in the session; tests share the results."""
    cache = {}

    def _trained(model="llama", preset="zero3", nproc=1, *flags, launcher=None, env=None, task="causal"):
        key = (model, preset, nproc, flags, launcher, tuple(sorted((env or {}).items())), task)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{model}-{preset}-{nproc}")
            args = ["--model", tiny_models[model], "--out", out, "--task", task, *flags]
            if preset:
                args += ["--deepspeed", preset]
            run_worker(args, nproc=nproc, launcher=launcher, env=env)
            cache[key] = out
        return cache[key]

    return _trained


@pytest.fixture(scope="session")
def accelerate_zero3_loop(tiny_models, tmp_path_factory):
    """Accelerate's README loop with hf_zero (tests/workers/train_accelerate.py) under the zero3 YAML, 2 processes,
    once per session: its result.json, gathered weights and saved model."""
    out = tmp_path_factory.mktemp("accelerate_zero3_loop")
    run_worker(["--model", tiny_models["llama"], "--out", out], nproc=2, launcher="accelerate:zero3",
               script=REPO / "tests" / "workers" / "train_accelerate.py")
    return out


def scenario_results(script: Path, model_path, out: Path, *, left_out=(), timeout=600):
    """Run a one-process scenario worker (tests/workers/scenario_runner.py) and return ``scenario(name)``: that
    scenario's result with the warnings that contain any of ``left_out`` taken out (``scenario.raw`` keeps all)."""
    run_worker(["--model", model_path, "--out", out], script=script, timeout=timeout)
    results = json.loads((out / f"{script.stem}.json").read_text())

    def scenario(name):
        result = dict(results[name])
        result["warnings"] = [w for w in result["warnings"] if not any(text in w for text in left_out)]
        return result

    scenario.raw = results
    return scenario
