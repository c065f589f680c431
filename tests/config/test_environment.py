"""Environment checks (hf_zero/config/environment.py): each fires on a bad variable and stays quiet otherwise."""

import pytest

import hf_zero
from hf_zero.config import validate_config


def env_codes(config, **kwargs):
    return [f.code for f in validate_config(config, environment=True, **kwargs)]


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("NCCL_TIMEOUT", "TORCH_CUDA_ARCH_LIST", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return monkeypatch


def test_quiet_in_a_clean_environment(clean_env):
    assert env_codes(hf_zero.load_config("zero3_offload"), on_cpu=True, world_size=2) == []


def test_nccl_timeout_is_not_an_nccl_variable(clean_env):
    clean_env.setenv("NCCL_TIMEOUT", "3600")
    assert env_codes(hf_zero.load_config("zero2")) == ["nccl-timeout"]


@pytest.mark.parametrize("arch, fires", [("9.0a", True), ("8.0;9.0a", True), ("9.0", False), ("8.6+PTX", False)])
def test_cuda_arch_suffix(clean_env, arch, fires):
    clean_env.setenv("TORCH_CUDA_ARCH_LIST", arch)
    assert ("cuda-arch-suffix" in env_codes(hf_zero.load_config("zero2_offload"))) is fires


def test_quiet_about_the_arch_suffix_when_nothing_is_built(clean_env):
    clean_env.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    config = hf_zero.load_config("zero2", overrides={"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    assert "cuda-arch-suffix" in env_codes(config)  # DeepSpeed's FusedAdam is compiled
    del config["optimizer"]  # the Trainer's torch AdamW and no offload: DeepSpeed compiles no op
    assert env_codes(config) == []


def test_missing_compiler_for_op_builds(clean_env):
    clean_env.setenv("PATH", "/nonexistent")
    assert env_codes(hf_zero.load_config("zero2_offload")) == ["no-compiler"]
    config = hf_zero.load_config("zero2")  # the Trainer's torch AdamW, no offload: nothing to compile
    assert env_codes(config) == []


def test_omp_threads_unset_with_several_processes(clean_env):
    clean_env.delenv("OMP_NUM_THREADS")
    assert env_codes(hf_zero.load_config("zero2"), on_cpu=True, world_size=2) == ["omp-threads"]
    assert env_codes(hf_zero.load_config("zero2"), on_cpu=True, world_size=1) == []
