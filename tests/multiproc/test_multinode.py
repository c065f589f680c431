"""Two "nodes" on this machine: two launcher processes (--nnodes 2, --node_rank 0 and 1) meeting at 127.0.0.1.

Each node runs one worker, so both workers have LOCAL_RANK 0 and LOCAL_WORLD_SIZE 1, as one GPU
per machine would: what must hold is that they still train as one ZeRO-3 world of 2, that only
global rank 0 writes the saved model (the Trainer's save_on_each_node is off), and that it reloads.
"""

import sys

import pytest
import yaml

from conftest import REPO, WORKER, assert_reload_bitwise, assert_same_losses, assert_trained, launcher_script, read_result, run_nodes
import hf_zero
from hf_zero.config.accelerate_yaml import yaml_deepspeed_config
from hf_zero.distributed import free_port

pytestmark = pytest.mark.multiproc

MULTINODE_YAML = REPO / "recipes" / "accelerate" / "zero3_multinode.yaml"


def node_command(launcher: str, node_rank: int, port: int, script_args: list) -> list:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node_rank),
                "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                str(WORKER), *script_args, "--deepspeed", "zero3"]
    # the YAML's placeholders overridden as a user does on each machine; 2 processes in all, 1 per node
    return [launcher_script("accelerate"), "launch", "--config_file", str(MULTINODE_YAML), "--num_processes", "2",
            "--machine_rank", str(node_rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
            str(WORKER), *script_args]


def run_two_nodes(launcher: str, script_args: list, timeout=600):
    """Start both nodes together and wait for both (conftest.run_nodes)."""
    port = free_port()
    return run_nodes([node_command(launcher, rank, port, [str(a) for a in script_args]) for rank in (0, 1)],
                     cwd=REPO, timeout=timeout)


@pytest.mark.long  # two launchers rendezvousing take half a minute each; make test-long
@pytest.mark.parametrize("launcher", ["torchrun", pytest.param("accelerate", marks=pytest.mark.slow)])
def test_two_nodes_train_save_and_reload_zero3(tiny_models, trained, tmp_path, launcher):
    run_two_nodes(launcher, ["--model", tiny_models["llama"], "--out", tmp_path])
    result = read_result(tmp_path)
    assert result["engine"] == "DeepSpeedEngine"
    assert result["world_size"] == 2 and result["dp_world_size"] == 2
    assert result["partitioned_at_load"] is True
    # the same world of 2 on one node (shared with test_zero_training): the collectives really summed both
    # nodes' gradients (DeepSpeed's CPU shm allreduce stays off: it needs LOCAL_SIZE == world size)
    assert_same_losses(result["losses"], read_result(trained("llama", "zero3", 2))["losses"], "two nodes, one node")
    assert_trained(tmp_path, tiny_models["llama"])
    assert_reload_bitwise(tmp_path)


def test_multinode_yaml_is_the_zero3_preset_on_two_machines():
    config = yaml.safe_load(MULTINODE_YAML.read_text())
    assert config["distributed_type"] == "DEEPSPEED" and config["num_machines"] == 2
    assert yaml_deepspeed_config(MULTINODE_YAML) == hf_zero.load_config("zero3")
    assert config["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
    assert config["deepspeed_config"]["zero3_init_flag"] is True
    # a placeholder, not an address: a forgotten --main_process_ip fails instead of waiting on localhost
    assert config["main_process_ip"] == "MAIN_MACHINE_IP"
