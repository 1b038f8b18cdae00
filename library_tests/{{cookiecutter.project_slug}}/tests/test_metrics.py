"""kit.metrics: epoch means and metric objects logged through Lightning once an epoch, metric
objects updated on the logging steps only."""

from pathlib import Path

import pytest
import torch
from lightning import Callback, LightningModule, Trainer
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from {{ cookiecutter.package_name }}.kit import metrics as kit_metrics
from {{ cookiecutter.package_name }}.kit.metrics import EpochMeans, log_metrics, on_logging_steps


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


class Classified(LightningModule):
    """Logs the same metrics two ways: updated at every step, and on the logging steps only."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 3)
        metrics = MetricCollection(
            {"acc": MulticlassAccuracy(3, average="micro"), "f1": MulticlassF1Score(3)}
        )
        self.every_step = metrics.clone(prefix="plain/")
        self.held = on_logging_steps(metrics.clone(prefix="held/"))
        self.applied_at: list[int] = []  # the steps whose end found the held metric updated
        self.counts: list[int] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.layer(x)
        log_metrics(self, self.every_step, logits, y)
        log_metrics(self, self.held, logits, y)
        count = self.held["acc"].metric.update_count
        if count != (self.counts or [0])[-1]:
            self.applied_at.append(self.global_step)
        self.counts.append(count)
        return torch.nn.functional.cross_entropy(logits, y)

    def on_train_epoch_start(self) -> None:
        self.counts = []  # Lightning resets the metrics at each epoch's end

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def test_metrics_updated_on_logging_steps_only_give_the_values_of_every_step(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(26, 2), torch.randint(0, 3, (26,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)  # 7 steps an epoch, the last of 2
    trainer = Trainer(
        max_epochs=2, log_every_n_steps=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    seen: list[dict[str, float]] = []

    class Read(Callback):
        def on_train_epoch_end(self, trainer: Trainer, module: LightningModule) -> None:
            seen.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    module = Classified()
    trainer.callbacks.append(Read())
    trainer.fit(module, loader)
    # Updated on the steps that log (global steps 2, 5, 8, 11) with the steps held since.
    assert module.applied_at == [2, 5, 8, 11]
    assert module.counts == [0, 1, 1, 1, 2, 2, 2]  # the last epoch's (steps 7 to 13)
    assert module.trainer.callback_metrics.keys() >= {"held/acc", "held/f1"}
    for values in seen:
        for name in ("acc", "f1"):
            assert values[f"held/{name}"] == pytest.approx(values[f"plain/{name}"])
    assert seen[0] != seen[1]
    held = module.held["acc"]
    assert held.higher_is_better is True and held.held == []  # reset by Lightning
    # Checkpoints are the same with or without them: metric states are not saved.
    assert list(module.state_dict()) == ["layer.weight", "layer.bias"]


def test_held_inputs_are_applied_before_they_pass_their_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 10 preds and 10 targets of 8 bytes: 160 bytes a step, the third passes 400.
    monkeypatch.setattr(kit_metrics, "HELD_BYTES", 400)
    (held,) = on_logging_steps(MetricCollection([MulticlassAccuracy(2, average="micro")])).values()
    for step in range(3):
        held.update(torch.ones(10, dtype=torch.long), torch.full((10,), step % 2))
        assert held.metric.update_count == (step == 2)
    assert held.held == [] and float(held.compute()) == pytest.approx(1 / 3)


def test_asked_for_a_batch_value_it_says_how_to_update_it() -> None:
    # metric(preds, target), Lightning's usual idiom, would wait for the device at every step.
    (held,) = on_logging_steps(MetricCollection([MulticlassAccuracy(2, average="micro")])).values()
    with pytest.raises(TypeError, match=r"^MulticlassAccuracy is updated on the logging steps"):
        held(torch.tensor([1, 1]), torch.tensor([0, 0]))
    held.update(torch.tensor([1, 1]), torch.tensor([1, 0]))
    assert float(held.compute()) == pytest.approx(0.5)
    held.reset()
    assert held.held == [] and held.metric.update_count == 0
