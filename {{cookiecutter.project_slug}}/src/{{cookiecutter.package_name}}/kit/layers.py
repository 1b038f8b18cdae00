"""Which layers of a network are its classifier: the answer the model, the transfer learning and
the backbone freezing share."""

from torch import nn


def last_linear(net: nn.Module) -> str:
    """The name of the last nn.Linear of `net`, the classifier ("" if it has none)."""
    names = [name for name, module in net.named_modules() if isinstance(module, nn.Linear)]
    return names[-1] if names else ""


def features(network: nn.Module) -> list[nn.Parameter]:
    """The parameters of a network before its classifier (its last linear layer)."""
    name = last_linear(network)
    head = set(network.get_submodule(name).parameters()) if name else set()
    return [parameter for parameter in network.parameters() if parameter not in head]
