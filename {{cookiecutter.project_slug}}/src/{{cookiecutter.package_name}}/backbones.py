"""Plain nn.Modules that map a batch of images (N, C, H, W) to class logits.

Each takes `in_channels` and `num_classes` first; the model builds it with the
numbers the data module reports, so a config only names the class and its
remaining arguments.
"""

from pathlib import Path

import torchvision
from jsonargparse.typing import NonNegativeInt, PositiveInt
from torch import Tensor, nn

from .kit.errors import ConfigError
from .kit.layers import last_linear


class ConvNet(nn.Module):
    """A convolution at full resolution, then `stages` stages that each halve the feature
    maps (max-pool) and double the channels with two conv blocks; a linear head on the
    global average. The maps shrink before the channels widen, so most of the work runs
    on small maps: fast per step, and accurate on small images."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        width: PositiveInt = 32,
        stages: NonNegativeInt = 2,
        dropout: float = 0.1,
        head_penalty: float = 0.0,
    ) -> None:
        super().__init__()
        layers = [conv_block(in_channels, width)]
        for stage in range(stages):
            channels = width * 2**stage
            layers += [
                nn.MaxPool2d(2),
                conv_block(channels, 2 * channels),
                conv_block(2 * channels, 2 * channels),
            ]
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        # An L2 penalty on the head's weight joins the training loss (0: a plain linear head).
        head = L2Linear(width * 2**stages, num_classes, head_penalty)
        self.head = nn.Sequential(nn.Dropout(dropout), head)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class L2Linear(nn.Linear):
    """A linear layer that carries an L2 penalty on its weight: `penalty` * sum(weight ** 2).

    Any module of a backbone may define `regularization_loss()`: the model adds it to the
    training loss and logs it as train/regularization/<module name>.
    """

    def __init__(self, in_features: int, out_features: int, penalty: float = 0.0) -> None:
        super().__init__(in_features, out_features)
        self.penalty = penalty

    def regularization_loss(self) -> Tensor | None:
        return self.penalty * self.weight.square().sum() if self.penalty else None


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class TorchvisionBackbone(nn.Module):
    """Any torchvision classification model by name, e.g. resnet18 or efficientnet_b0.

    `weights` names torchvision weights ("DEFAULT", "IMAGENET1K_V1", ...); they are
    downloaded on first use and the final linear layer is replaced to fit
    `num_classes`. Inputs with other than 3 channels pass through a 1x1 conv first.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        name: str = "resnet18",
        weights: str | None = None,
    ) -> None:
        super().__init__()
        available = torchvision.models.list_models(module=torchvision.models)
        if name not in available:
            raise ConfigError(
                f"backbone name {name!r} is not a torchvision classification model; "
                f"accepted: {', '.join(available)}"
            )
        known = ["DEFAULT", *(w.name for w in torchvision.models.get_model_weights(name))]
        if weights is not None and weights not in known:
            raise ConfigError(f"weights {weights!r} of {name}: accepted: {', '.join(known)}")
        if weights is None:
            self.net = torchvision.models.get_model(name, num_classes=num_classes)
        else:
            self.net = torchvision.models.get_model(name, weights=weights)
            replace_last_linear(self.net, num_classes)
        self.stem = nn.Identity() if in_channels == 3 else nn.Conv2d(in_channels, 3, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(self.stem(x))


class TimmBackbone(nn.Module):
    """Any timm model by name, e.g. resnet50, convnext_tiny or efficientnet_b0 (the `timm`
    extra: pip install -e ".[timm]").

    timm builds it for the data's channels and classes. `pretrained` loads the model's
    pretrained weights, downloaded on first use, or read from `checkpoint_path` (a file, for a
    machine without internet); timm fits their first layer to the channels, and starts the
    classifier new for another class count.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        model_name: str = "resnet18",
        pretrained: bool = False,
        checkpoint_path: str | None = None,
    ) -> None:
        super().__init__()
        try:
            import timm  # optional: only this backbone needs it
        except ImportError:
            raise ConfigError(
                'TimmBackbone needs timm, which is not installed: pip install -e ".[timm]"'
            ) from None
        if not timm.is_model(model_name):
            raise ConfigError(
                f"model_name {model_name!r} is not a timm model; "
                "timm.list_models('*resnet*') lists names that match a pattern"
            )
        if checkpoint_path is not None and not Path(checkpoint_path).is_file():
            raise ConfigError(f"checkpoint_path {checkpoint_path} is not a file of weights")
        self.net = timm.create_model(
            model_name,
            pretrained=pretrained or checkpoint_path is not None,
            pretrained_cfg_overlay={"file": checkpoint_path} if checkpoint_path else None,
            in_chans=in_channels,
            num_classes=num_classes,
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


def replace_last_linear(net: nn.Module, num_classes: int) -> None:
    """Swap the last nn.Linear of `net` for a fresh one with `num_classes` outputs."""
    name = last_linear(net)
    last = net.get_submodule(name)
    parent_name, _, attr = name.rpartition(".")
    parent = net.get_submodule(parent_name) if parent_name else net
    setattr(parent, attr, nn.Linear(last.in_features, num_classes))
