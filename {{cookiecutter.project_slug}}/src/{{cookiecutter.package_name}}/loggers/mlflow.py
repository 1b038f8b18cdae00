"""Where the metrics go: a local MLflow store (a SQLite file, no server), and a metrics.csv.

The CSVLogger comes first: its runs/<name>/version_<N>/ is the run folder that holds
checkpoints, plots and config.yaml, and that cli.py resumes by.
"""

TRACKING_URI = "sqlite:///runs/mlflow.db"

LOGGER = [
    {
        "class_path": "{{ cookiecutter.package_name }}.compat.AppendingCSVLogger",
        "init_args": {"save_dir": "runs", "name": "default"},
    },
    {
        "class_path": "lightning.pytorch.loggers.MLFlowLogger",
        "init_args": {"experiment_name": "default", "tracking_uri": TRACKING_URI},
    },
]


def how_to_watch(run_folder: str) -> str:
    """The command that opens the MLflow UI on the local store."""
    return f"mlflow ui --backend-store-uri {TRACKING_URI}  (the UI needs the full mlflow package)"
