"""``--exactness``: does each setup train as DDP does? The first step's gradients, parameter by parameter, and the loss
of every step, against a DDP launch on the same data.

In the worker, ``FirstStepGradients`` takes every parameter's full gradient after the first backward and before
anything changes it (DDP: before the Trainer clips it; DeepSpeed: before ``engine.step``, which clips and steps).
The first DDP setup of a sweep writes them as the reference (one file per kind of model: full, or with a LoRA
adapter); every later setup compares its own with it and records the relative L2 error over all parameters, the
worst parameters, and how many it could compare. A second DDP setup measures DDP-against-DDP noise.

In the report, a setup trains as DDP does when its gradient error and its loss curve's largest gap to DDP's stay
within the tolerances below, which are set from that noise and from the rounding of bf16 weights.
"""

import torch

# The first step's gradient, relative L2 error over all parameters. DeepSpeed's bf16 mode computes it with bf16
# weights; DDP under autocast computes it from fp32 weights, a gap that grows with depth (one CPU process, sequence
# 1024: 0.025 for 8 layers, 0.275 for 24; benchmarks/cpu/bf16_gap). A sweep with a DDP row of bf16 weights
# (``weights=bf16``) gives DeepSpeed rows that reference instead: the same arithmetic, where reduction order and
# bf16 rounding of the reduced gradients remain (bf16 keeps 8 significant bits, relative rounding up to 2**-8).
GRAD_TOLERANCE = 0.03
# The loss of the same step, largest gap over the run: DDP against DDP (the sweep's own noise row), times this
# factor, and never below LOSS_FLOOR (bf16 weights against autocast moved 10 steps' losses by up to 0.01 on one H200).
NOISE_FACTOR = 3.0
LOSS_FLOOR = 0.02


def compiled(setup: dict) -> bool:
    """Whether the Trainer compiles the model (``args.torch_compile``)."""
    return bool((setup.get("args") or {}).get("torch_compile"))


def reference_key(setup: dict) -> str:
    """The reference a DDP setup writes: all parameters train ("full"), the same with bf16 weights ("full-bf16"), or a
    LoRA adapter ("lora"); a compiled DDP setup writes its own ("...-compiled"), since compiled kernels round
    differently from eager ones."""
    if setup.get("lora"):
        return "lora"
    key = "full-bf16" if setup.get("weights") == "bf16" else "full"
    return key + "-compiled" if setup.get("kind") == "ddp" and compiled(setup) else key


def gradient_reference_key(setup: dict, available) -> str:
    """The DDP reference a setup's first-step gradients compare with: a DeepSpeed setup computes with bf16 weights,
    so a DDP row with bf16 weights where the sweep has one (``available(key)``), compiled as the setup is where the
    sweep has that too; otherwise the same kind of model."""
    key = reference_key(setup)
    if setup.get("kind") != "deepspeed" or key != "full":
        return key
    preferred = ("full-bf16-compiled", "full-bf16") if compiled(setup) else ("full-bf16",)
    return next((k for k in preferred if available(k)), key)


class FirstStepGradients:
    """Every parameter's full gradient after the first backward, as fp32 on the CPU (a collective under ZeRO-3: every
    rank calls it). Installed once the engine exists: ``install(trainer)`` in on_train_begin."""

    def __init__(self):
        self.grads = None

    def take(self, model) -> None:
        from deepspeed.utils import safe_get_full_grad

        if self.grads is not None:
            return
        grads = {}
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            grad = safe_get_full_grad(param) if hasattr(param, "ds_id") or hasattr(param, "_hp_mapping") else param.grad
            if grad is not None:
                grads[_plain_name(name)] = grad.detach().float().cpu()
        self.grads = grads

    def install(self, trainer) -> None:
        engine = trainer.model_wrapped
        if hasattr(engine, "backward") and hasattr(engine, "step") and type(engine).__name__ == "DeepSpeedEngine":
            step = engine.step

            def step_after_taking(*args, **kwargs):
                self.take(engine.module)
                return step(*args, **kwargs)

            engine.step = step_after_taking  # Accelerate's backward calls engine.step() right after engine.backward()
            return
        clip = trainer.accelerator.clip_grad_norm_

        def clip_after_taking(parameters, *args, **kwargs):
            parameters = list(parameters)
            self.take(trainer.model)
            return clip(parameters, *args, **kwargs)

        trainer.accelerator.clip_grad_norm_ = clip_after_taking


def _plain_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP's ``module.``, torch.compile's ``_orig_mod.``)."""
    for prefix in ("module.", "_orig_mod."):
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name


def compare(grads: dict, reference: dict, worst: int = 5) -> dict:
    """Relative L2 error of ``grads`` against ``reference`` over the parameters both hold, and the worst ones."""
    common = [name for name in reference if name in grads]
    if not common:
        return {"compared": 0, "note": "no parameter in common with the reference"}
    squared_diff = squared_ref = 0.0
    per_param = []
    for name in common:
        ref, ours = reference[name], grads[name]
        if ref.shape != ours.shape:
            per_param.append((float("inf"), name))
            continue
        diff, norm = (ours - ref).norm().item(), ref.norm().item()
        squared_diff, squared_ref = squared_diff + diff**2, squared_ref + norm**2
        per_param.append((diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf")), name))
    per_param.sort(reverse=True)
    return {"compared": len(common), "missing": len(reference) - len(common),
            "relative_error": (squared_diff / squared_ref) ** 0.5 if squared_ref > 0 else 0.0,
            "worst": [{"param": name, "relative_error": error} for error, name in per_param[:worst]]}


def save_reference(grads: dict, path) -> None:
    from safetensors.torch import save_file

    save_file({name: g.contiguous() for name, g in grads.items()}, str(path))


def load_reference(path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def loss_gap(losses: list, reference: list) -> float | None:
    """The largest gap between two loss curves over the steps both logged."""
    steps = min(len(losses), len(reference))
    if steps == 0:
        return None
    return max(abs(a - b) for a, b in zip(losses[:steps], reference[:steps]))


def noise(rows: list) -> dict:
    """DDP against DDP: the gradient error and the loss gap of every DDP row after the reference."""
    ddp = [r for r in rows if r.get("kind") == "ddp" and r.get("exactness", {}).get("role") == "compared"]
    grads = [r["exactness"]["gradients"].get("relative_error") for r in ddp]
    gaps = [r["exactness"].get("loss_gap") for r in ddp]
    return {"rows": [r["name"] for r in ddp],
            "grad_error": max((g for g in grads if g is not None), default=None),
            "loss_gap": max((g for g in gaps if g is not None), default=None)}


def tolerances(rows: list) -> dict:
    measured = noise(rows)
    loss = LOSS_FLOOR if measured["loss_gap"] is None else max(LOSS_FLOOR, NOISE_FACTOR * measured["loss_gap"])
    return {"grad": GRAD_TOLERANCE, "loss": loss, "noise": measured}


def verdict(row: dict, limits: dict) -> str:
    """"within", "OUTSIDE" or why it cannot say."""
    found = row.get("exactness") or {}
    if found.get("role") == "reference":
        return "reference"
    grads = found.get("gradients") or {}
    if not grads.get("compared"):
        return grads.get("note") or "not compared"
    within = grads["relative_error"] <= limits["grad"] and (found.get("loss_gap") or 0.0) <= limits["loss"]
    return "within" if within else "OUTSIDE"


def table(data: dict) -> str:
    """Markdown: each setup's first-step gradient error and loss gap against DDP, with the tolerances."""
    rows = [r for r in data["results"] if r.get("status") == "ok" and r.get("exactness")]
    if not rows:
        return ""
    limits = tolerances(rows)
    measured = limits["noise"]
    noise_text = ("no second DDP row: the loss tolerance is the floor" if measured["grad_error"] is None else
                  f"DDP against DDP ({', '.join(measured['rows'])}): gradient error {measured['grad_error']:.2g}, "
                  f"loss gap {measured['loss_gap']:.3g}")
    lines = ["## Trains as DDP does (first-step gradients and the loss of every step, against DDP on the same data)", "",
             f"Noise: {noise_text}. Tolerances: gradient error <= {limits['grad']:g}, "
             f"loss gap <= {limits['loss']:.3g} (max of {LOSS_FLOOR:g} and {NOISE_FACTOR:g}x the DDP noise). "
             "Gradients compare with the DDP row of the same arithmetic where the sweep has one (bf16 weights for "
             "DeepSpeed's bf16 mode), losses with DDP's fp32 weights under autocast; `reference` names both.", "",
             "| setup | reference | gradient error | worst parameter | loss gap | losses | verdict |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        found = row["exactness"]
        grads = found.get("gradients") or {}
        worst = grads.get("worst") or [{}]
        losses = row.get("losses") or []
        shown = ", ".join(f"{x:.3f}" for x in losses[::max(1, len(losses) // 4)])
        error = grads.get("relative_error")
        gap = found.get("loss_gap")
        named = found.get("reference", "")
        if found.get("loss_reference") and found["loss_reference"] != named:
            named = f"{named} (losses: {found['loss_reference']})"
        lines.append(f"| {row['name']} | {named} | "
                     f"{'' if error is None else f'{error:.3g}'} | "
                     f"{worst[0].get('param', '')} {'' if not worst[0] else format(worst[0]['relative_error'], '.3g')} | "
                     f"{'' if gap is None else f'{gap:.3g}'} | {shown} | {verdict(row, limits)} |")
    return "\n".join(lines) + "\n"

