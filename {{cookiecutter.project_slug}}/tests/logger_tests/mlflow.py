"""The MLflow logger: metrics reach a local store, with no server and no network."""

from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

RUN = Path("runs/default/version_0")
TRACKING_URI = "sqlite:///runs/mlflow.db"  # configs/default.yaml's


def test_metrics_reach_the_local_mlflow_store_and_the_run_folder(train: Callable) -> None:
    metrics = train()
    client = MlflowClient(tracking_uri=TRACKING_URI)
    experiment = client.get_experiment_by_name("default")
    # MLflow caches its store per tracking URI for the whole process, so earlier tests' runs
    # may share it: this test's run is the newest one.
    (run,) = client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1
    )
    assert run.info.status == "FINISHED"
    assert run.data.metrics["test/acc"] == pytest.approx(metrics["test/acc"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")]
    assert (RUN / "metrics.csv").is_file() and (RUN / "checkpoints" / "last.ckpt").is_file()


def test_hyperparameters_reach_the_mlflow_run_as_params(train: Callable) -> None:
    train("--model.optimizer.init_args.lr", "0.003", "--seed_everything", "7")
    client = MlflowClient(tracking_uri=TRACKING_URI)
    experiment = client.get_experiment_by_name("default")
    (run,) = client.search_runs(
        [experiment.experiment_id], order_by=["attributes.start_time DESC"], max_results=1
    )
    assert float(run.data.params["model.optimizer.init_args.lr"]) == pytest.approx(0.003)
    assert run.data.params["seed_everything"] == "7"
    assert "test/acc" in run.data.metrics
