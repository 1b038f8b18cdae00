"""Where the metrics go: a metrics.csv in each run folder."""

# cli.py resumes by the first logger's folder, runs/<name>/version_<N>/: the run folder.
LOGGER = {
    "class_path": "{{ cookiecutter.package_name }}.compat.AppendingCSVLogger",
    "init_args": {"save_dir": "runs", "name": "default"},
}


def how_to_watch(run_folder: str) -> str:
    """Where the logged metrics of this run are."""
    return f"{run_folder}/metrics.csv (curves in {run_folder}/plots/)"
