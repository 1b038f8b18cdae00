"""Which layers of a network are its classifier (the answer the model, the transfer learning and
the backbone freezing share), readable names of its modules, and its weights' memory layout."""

import re

import torch
from torch import nn
from torch.nn.parameter import is_lazy


def last_linear(net: nn.Module) -> str:
    """The name of the last nn.Linear of `net`, the classifier ("" if it has none)."""
    names = [name for name, module in net.named_modules() if isinstance(module, nn.Linear)]
    return names[-1] if names else ""


def features(network: nn.Module) -> list[nn.Parameter]:
    """The parameters of a network before its classifier (its last linear layer)."""
    name = last_linear(network)
    head = set(network.get_submodule(name).parameters()) if name else set()
    return [parameter for parameter in network.parameters() if parameter not in head]


def readable_name(network: nn.Module, name: str) -> str:
    """A module's name with each list position replaced by its class in snake case:
    head.1 -> head.l2_linear (the state_dict keys keep the positions)."""
    parts, module = [], network
    for part in name.split(".") if name else []:
        module = module.get_submodule(part)
        class_name = re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", type(module).__name__).lower()
        parts.append(class_name if part.isdigit() else part)
    return ".".join(parts) or "backbone"


def to_channels_last(network: nn.Module) -> None:
    """Store the 4-D (image-shaped) parameters and buffers of `network` channels-last, in place.

    Tensors with one channel keep their strides: their bytes are the same in both layouts.

    Like `network.to(memory_format=torch.channels_last)`, which fails on a lazy module's
    parameters before their first forward; those keep their layout here.
    """
    for tensor in [*network.parameters(), *network.buffers()]:
        # With one input channel (a first convolution on greyscale images) both layouts hold
        # the same bytes; only the strides differ, and DDP's gradient buckets expect the
        # contiguous ones ("Grad strides do not match bucket view strides").
        if not is_lazy(tensor) and tensor.dim() == 4 and tensor.shape[1] > 1:
            tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)


def contiguous_single_channel_grads(network: nn.Module) -> None:
    """Give the gradients of one-channel 4-D weights the strides of their weights.

    Next to channels-last layers, a convolution on one input channel gets its weight's
    gradient with channels-last strides. With one channel both describe the same bytes, but
    DDP compares strides and warns at every run ("Grad strides do not match bucket view
    strides"). Set where training starts (hooks are not pickled: ddp_spawn's processes set
    their own); a second fit adds a second hook, which changes nothing.
    """
    for weight in network.parameters():
        if not is_lazy(weight) and weight.dim() == 4 and weight.shape[1] == 1:
            weight.register_hook(lambda grad: grad.clone(memory_format=torch.contiguous_format))
