"""Which modules a ``stage3_module_granularity_threshold`` makes ZeRO-3 leaves, known before the engine exists.

DeepSpeed applies the threshold when its engine starts (runtime/zero/parameter_offload.py, the same rule in 0.18.0
and 0.19.8): a module's granularity is its parameters over its "layers" (each module with parameters, containers not
counted), none above 1e9 parameters; modules at or under the threshold become leaves, parents first. The checks need
the answer earlier, to refuse or adjust a leaf before DeepSpeed makes it one.
"""

import torch

LEAF_SIZE_CAP = 1e9


def module_granularities(model, numel) -> dict:
    """{module: (layers, parameters, granularity)} for ``model`` and every module in it, as DeepSpeed's threshold rule
    counts them; ``numel(param)`` gives a parameter's full size (a ZeRO-3 partition's too). The granularity is None
    where DeepSpeed never makes a leaf."""
    found = {}

    def measure(module):
        if not any(True for _ in module.parameters()):
            found[module] = (0, 0, None)
            return found[module]
        own = sum(numel(p) for p in module.parameters(recurse=False))
        children = list(module.children())
        if not children:
            found[module] = (1, own, None)
            return found[module]
        layers, params = 0, own
        for child in children:
            child_layers, child_params, _ = measure(child)
            layers, params = layers + child_layers, params + child_params
        if type(module).__name__ in torch.nn.modules.container.__all__:
            found[module] = (layers, params, None)
        else:
            layers += 1
            found[module] = (layers, params, params // layers if params <= LEAF_SIZE_CAP else None)
        return found[module]

    measure(model)
    return found


def threshold_leaves(model, threshold: int, numel, eligible=None) -> list:
    """[(qualified name, module)] that a stage3_module_granularity_threshold of ``threshold`` makes ZeRO-3 leaves, the
    topmost first; "" names the model itself. With ``eligible``, a module it refuses is passed over as if its
    granularity were above the threshold: the rule goes on into its children."""
    granularity = module_granularities(model, numel)
    leaves = []

    def visit(name, module):
        measured = granularity[module][2]
        if granularity[module][1] == 0:
            return
        if measured is not None and measured <= threshold and (eligible is None or eligible(module)):
            leaves.append((name, module))
            return
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", model)
    return leaves
