"""Where the metrics go: Weights & Biases in offline mode (no account), and a metrics.csv.

The CSVLogger comes first: its runs/<name>/version_<N>/ is the run folder that holds
checkpoints, plots and config.yaml, and that cli.py resumes by. W&B writes its offline
runs under runs/wandb/; `wandb sync` uploads them once you have an account.
"""

LOGGER = [
    {
        "class_path": "{{ cookiecutter.package_name }}.compat.AppendingCSVLogger",
        "init_args": {"save_dir": "runs", "name": "default"},
    },
    {
        "class_path": "lightning.pytorch.loggers.WandbLogger",
        "init_args": {"project": "default", "save_dir": "runs", "offline": True},
    },
]


def how_to_watch(run_folder: str) -> str:
    """The command that uploads the offline W&B runs (after `wandb login`)."""
    return "wandb sync runs/wandb/offline-run-*"
