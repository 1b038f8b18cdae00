"""A project of another kind for the library's tests: points in the plane, not images.

Its model and data module follow the library's contract (kit/project.py, kit/datamodule.py)
as the project's own do, with nothing of images: no PIL, torchvision, transforms or
convolutions. test_toy.py trains, resumes and repeats it with the library's entry points.
"""

from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
import yaml
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from {{ cookiecutter.package_name }}.kit.datamodule import ImageDataModule

CENTRES = torch.tensor([[-2.0, -2.0], [2.0, -2.0], [0.0, 2.5]])


class PointClassifier(L.LightningModule):
    """A small MLP over 2-D points; its last linear layer is the classifier."""

    def __init__(
        self, num_classes: int, input_shape: tuple[int, ...], hidden: int = 16, lr: float = 0.1
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(
            nn.Linear(input_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )
        self.val_metrics = MetricCollection(
            {"acc": MulticlassAccuracy(num_classes, average="micro")}, prefix="val/"
        )
        self.test_metrics = self.val_metrics.clone(prefix="test/")

    def forward(self, x: Tensor) -> Tensor:
        return self.backbone(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        points, labels = batch
        loss = F.cross_entropy(self(points), labels)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_metrics)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._evaluate(batch, "test", self.test_metrics)

    def _evaluate(
        self, batch: tuple[Tensor, Tensor], stage: str, metrics: MetricCollection
    ) -> Tensor:
        points, labels = batch
        logits = self(points)
        self.log(f"{stage}/loss", F.cross_entropy(logits, labels), sync_dist=True)
        metrics.update(logits, labels)
        self.log_dict(metrics)
        return logits

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class PointData(ImageDataModule):
    """Points drawn around three centres (a class each), seeded; a fifth held out for the test."""

    mean, std = (0.0, 0.0), (1.0, 1.0)

    @staticmethod
    def prediction_transform(input_shape: tuple[int, ...]) -> Callable[[object], Tensor]:
        """A row of numbers -> one model input."""
        return lambda row: torch.as_tensor(row, dtype=torch.float32).reshape(input_shape)

    def __init__(self, points: int = 600, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__(batch_size, 0, 0.2, seed)
        self.points = points
        self.class_names = ("south-west", "south-east", "north")
        self.input_shape = (2,)

    def setup(self, stage: str | None = None) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        labels = torch.randint(len(CENTRES), (self.points,), generator=generator)
        points = CENTRES[labels] + 0.6 * torch.randn(self.points, 2, generator=generator)
        test = self.points // 5
        self.test_set = TensorDataset(points[:test], labels[:test])
        self.train_set, self.val_set = self.split(
            *(TensorDataset(points[test:], labels[test:]),) * 2
        )


def write_defaults(project_defaults: Path, folder: Path) -> Path:
    """The project's defaults with this project's model and data in place of its own."""
    defaults = yaml.safe_load(project_defaults.read_text())
    defaults["model"] = {"hidden": 16, "lr": 0.1}
    defaults["data"] = {"class_path": f"{__name__}.PointData", "init_args": {"points": 600}}
    defaults["trainer"] = {**defaults["trainer"], "max_epochs": 3}
    path = folder / "toy_defaults.yaml"
    path.write_text(yaml.safe_dump(defaults))
    return path
