"""Search hyperparameters with Optuna. Run `python sweep.py --help` for the options."""

from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.kit.sweep import run
from {{ cookiecutter.package_name }}.project import project

if __name__ == "__main__":
    use(project)
    run()
