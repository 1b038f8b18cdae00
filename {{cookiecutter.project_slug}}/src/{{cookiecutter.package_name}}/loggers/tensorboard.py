"""Where the metrics go: TensorBoard event files in each run folder."""

# cli.py resumes by the first logger's folder, runs/<name>/version_<N>/: the run folder.
LOGGER = {
    "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
    "init_args": {"save_dir": "runs", "name": "default"},
}


def how_to_watch(run_folder: str) -> str:
    """The command that shows the logged metrics of every run."""
    return "tensorboard --logdir runs"
