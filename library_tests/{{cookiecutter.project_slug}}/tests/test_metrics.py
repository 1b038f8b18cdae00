"""kit.metrics: epoch means logged through Lightning once an epoch."""

from pathlib import Path

import pytest
import torch
from lightning import Callback, LightningModule, Trainer

from {{ cookiecutter.package_name }}.kit.metrics import EpochMeans


class Averaged(LightningModule):
    """Logs the epoch means of two per-step values, one of them with dots in its name."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.epoch_means = EpochMeans()
        self.steps: dict[int, list[tuple[float, int]]] = {}
        self.logs: list[tuple[str, int]] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (x,) = batch
        value = x.mean() + self.current_epoch  # a different mean each epoch
        self.steps.setdefault(self.current_epoch, []).append((value.item(), len(x)))
        self.epoch_means.log(self, "train/x_epoch", value, len(x), prog_bar=True)
        self.epoch_means.log(self, "train/x.head.weight", 2 * value, len(x))
        return self.layer(x).mean()

    def log(self, name: str, *args: object, **kwargs: object) -> None:
        self.logs.append((name, self.current_epoch))
        super().log(name, *args, **kwargs)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_epoch_means_weigh_each_step_by_its_batch_and_are_logged_once_an_epoch(
    tmp_path: Path,
) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(5.0).unsqueeze(1))
    loader = torch.utils.data.DataLoader(data, batch_size=2)  # batches of 2, 2 and 1
    trainer = Trainer(
        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    seen: dict[int, dict[str, float]] = {}

    class Read(Callback):
        def on_train_epoch_start(self, trainer: Trainer, module: LightningModule) -> None:
            if trainer.current_epoch:  # the previous epoch's means, as logged at its end
                seen[trainer.current_epoch - 1] = dict(trainer.callback_metrics)

    module = Averaged()
    trainer.callbacks.append(Read())
    trainer.fit(module, loader)
    seen[1] = dict(trainer.callback_metrics)
    assert sorted(module.logs) == sorted(
        (name, epoch) for name in ("train/x_epoch", "train/x.head.weight") for epoch in (0, 1)
    )
    for epoch in (0, 1):
        steps = module.steps[epoch]
        assert [size for _, size in steps] == [2, 2, 1]
        mean = sum(value * size for value, size in steps) / 5
        assert float(seen[epoch]["train/x_epoch"]) == pytest.approx(mean)
        assert float(seen[epoch]["train/x.head.weight"]) == pytest.approx(2 * mean)
    assert trainer.progress_bar_metrics["train/x_epoch"] == pytest.approx(mean)
    assert "train/x.head.weight" not in trainer.progress_bar_metrics
    # Checkpoints are the same with or without the means: they hold no state of their own.
    assert list(module.state_dict()) == ["layer.weight", "layer.bias"]


class TwoLoaders(LightningModule):
    """Logs the mean of each validation loader's values."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.epoch_means = EpochMeans()

    def validation_step(
        self, batch: list[torch.Tensor], batch_idx: int, dataloader_idx: int
    ) -> None:
        (x,) = batch
        self.epoch_means.log(self, "val/x", x.mean(), len(x))


def test_several_loaders_each_get_their_own_mean(tmp_path: Path) -> None:
    # One metric object per name would average the loaders together.
    first = torch.utils.data.TensorDataset(torch.tensor([[1.0], [2.0], [3.0]]))
    second = torch.utils.data.TensorDataset(torch.tensor([[10.0], [30.0]]))
    loaders = [torch.utils.data.DataLoader(data, batch_size=2) for data in (first, second)]
    trainer = Trainer(logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    (one, two) = trainer.validate(TwoLoaders(), loaders, verbose=False)
    assert one["val/x/dataloader_idx_0"] == pytest.approx(2.0)
    assert two["val/x/dataloader_idx_1"] == pytest.approx(20.0)
