"""One setup's estimate: its layout's count (layouts.py) for a model and a run, with what every layout adds."""

from .activations import activation_bytes
from .host_memory import PROCESS_HOST_BYTES, offloaded_activation_bytes
from .layouts import Layout, layout_named
from .phases import Terms
from .settings import settled
from .shapes import Estimate, ModelShape, RunShape


def terms_of(layout: Layout, model: ModelShape, run: RunShape) -> Terms:
    """What the layout's count starts from: what trains (every weight, or a LoRA adapter on the frozen base, its
    gradients and optimizer states alone), and under DeepSpeed the activations."""
    psi = model.params
    trained = model.adapter_params(run.lora_r, run.lora_targets) if run.lora_r else psi
    if run.lora_r:
        psi += trained  # the adapter's own weights
    activations = activation_bytes(model, run, zero3=layout.stage == 3) if layout.stage else 0
    # the weights' sizes in the model's order, for the offload layouts' buffers and sub-groups (not for an adapter)
    sizes = model.param_sizes() if trained == psi else ()
    return Terms(run, psi, trained, run.ranks, run.gpus_per_node, run.element_bytes, model, tuple(sizes), activations)


def estimate(setup, model: ModelShape, run: RunShape) -> Estimate:
    """Per-GPU memory at each phase of a step, and host and NVMe memory per node, of one layout (a Layout or its
    name). The run's config settings left None are the layout's preset's (settings.settled)."""
    layout = layout_named(setup)
    run = settled(run, layout.preset)
    terms = terms_of(layout, model, run)
    phases = layout.gpu_phases(terms)
    host, nvme = layout.states_off_gpu(terms)
    if layout.stage:
        host += offloaded_activation_bytes(model, run, run.element_bytes) * run.gpus_per_node
    else:  # the plain Trainer's residual stream is fp32, and it has no Ulysses
        host += offloaded_activation_bytes(model, run, 4, sequence_parallel=False) * run.gpus_per_node
    host += _add_reference_model(layout, phases, model, run)
    host += PROCESS_HOST_BYTES * run.gpus_per_node
    return Estimate(layout.name, phases, host, nvme)


def _add_reference_model(layout: Layout, phases: dict, model: ModelShape, run: RunShape) -> int:
    """TRL's reference model (DPO, KTO) in each phase; returns what it adds to the host per node.

    TRL builds it as a second DeepSpeed engine from the run's config: under ZeRO-3 partitioned like the policy
    (1/N of its 16-bit weights per GPU, on the host with parameter offload), under ZeRO-1/2 with stage 0, so a
    whole 16-bit copy sits on every GPU (as under DDP). With LoRA, TRL turns the adapter off instead: no copy."""
    if not run.reference_model or run.lora_r:
        return 0
    weights = run.element_bytes * model.params
    if layout.stage == 3 and run.params_on_host:
        return weights // run.ranks * run.gpus_per_node
    per_gpu = weights // run.ranks if layout.stage == 3 else weights
    for components in phases.values():
        components["reference model"] = per_gpu
    return 0

