"""hf-zero plan counts zero3_offload's split of the optimizer between host and GPU (offload_optimizer.ratio),
the parameters kept on the GPU, and writes the config it counted."""

import json

import pytest

from hf_zero.cli import main


def _row(capsys, *extra):
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "140", "--cpu-mem", "125", "--micro-batch", "32",
                 *extra]) == 0
    return next(r.split() for r in capsys.readouterr().out.splitlines() if r.startswith("zero3_offload "))


def test_plan_moves_the_split_between_gpu_and_host(capsys):
    preset = _row(capsys)
    partial = _row(capsys, "--offload-ratio", "0.3", "--params-on-gpu", "--sub-group-size", "100000000")
    # columns: params, grads, optim, step, activ, buffers, GPU GiB, host GiB
    assert (preset[1], preset[3]) == ("0.0", "0.0")
    # 9 of 13 sub-groups on the GPU at 16 bytes an element, the 16-bit parameters beside them (one H200: 97.65 GiB)
    assert (partial[1], partial[3], partial[7]) == ("2.5", "13.6", "97.6")
    assert float(partial[8]) < float(preset[8])


def test_plan_writes_the_split_it_counted(tmp_path, capsys):
    out = tmp_path / "ds.json"
    # 28 GiB of GPU hold none of the GPU-only setups, 30 GiB of host not zero2_offload's 32: the split fits both
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "28", "--cpu-mem", "30", "--micro-batch", "4",
                 "--offload-ratio", "0.5", "--params-on-gpu", "--sub-group-size", "100000000", "--write", str(out)]) == 0
    assert "Recommended: zero3_offload" in capsys.readouterr().out
    zero = json.loads(out.read_text())["zero_optimization"]
    assert zero["offload_optimizer"]["ratio"] == 0.5 and zero["sub_group_size"] == 100_000_000
    assert "offload_param" not in zero


def test_a_ratio_outside_zero_to_one_is_one_message(capsys):
    for bad in ("1.5", "-0.1", "nan"):
        assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "140", "--offload-ratio", bad]) == 2
        assert "--offload-ratio must be between 0 and 1" in capsys.readouterr().err
    assert main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", "140", "--sub-group-size", "0"]) == 2
    assert "--sub-group-size must be at least 1" in capsys.readouterr().err


def _plan(capsys, gpu_mem, *extra):
    code = main(["plan", "1.35b", "--gpus", "1", "--gpu-mem", str(gpu_mem), "--cpu-mem", "125", "--micro-batch", "4",
                 *extra])
    return code, capsys.readouterr().out


def test_an_offload_plan_offers_the_split_the_gpu_holds(capsys):
    # 30.5 GiB (27.45 usable): zero2 (27.6 GiB) does not fit, 30% of the optimizer on the host with the parameters on
    # the GPU (27.1 GiB planned, 27.29 measured) does
    code, out = _plan(capsys, 30.5)
    assert code == 0 and "Recommended: zero2_offload" in out
    assert "also fits: zero3_offload with 30% of the optimizer on the host" in out
    assert "--offload-ratio 0.3 --params-on-gpu --sub-group-size 100000000" in out
    assert json.loads(_plan(capsys, 30.5, "--json")[1])["partial_offload"] == 0.3


@pytest.mark.parametrize("gpu_mem, extra", [
    (140, ()),  # the plain Trainer fits: nothing is offloaded
    (28, ()),  # not even 30% on the host fits beside the parameters (26.9 GiB over 25.2)
    (30, ("--offload-ratio", "0.3", "--params-on-gpu")),  # the run already asks for a placement
])
def test_no_split_offered_otherwise(capsys, gpu_mem, extra):
    _, out = _plan(capsys, gpu_mem, *extra)
    assert "also fits: zero3_offload" not in out
