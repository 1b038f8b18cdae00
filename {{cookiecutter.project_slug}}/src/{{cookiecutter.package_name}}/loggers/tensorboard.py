"""Where the metrics go: TensorBoard event files in each run folder."""

# cli.py resumes by the first logger's folder, runs/<name>/version_<N>/: the run folder.
LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    # The HParams tab gets each run's hyperparameters with its test metrics once it is tested,
    # not a placeholder metric at the start.
    "init_args": {"save_dir": "runs", "name": "default", "default_hp_metric": False},
}


def how_to_watch(run_folder: str) -> str:
    """The command that shows the logged metrics of every run."""
    return "tensorboard --logdir runs"
