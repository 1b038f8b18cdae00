"""Search hyperparameters with Optuna. Run `python sweep.py --help` for the options."""

from {{ cookiecutter.package_name }}.sweep import run

if __name__ == "__main__":
    run()
