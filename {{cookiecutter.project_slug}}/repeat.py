"""Train one configuration over seeds or folds. Run `python repeat.py --help` for the options."""

from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.kit.repeat import run
from {{ cookiecutter.package_name }}.project import project

if __name__ == "__main__":
    use(project)
    run()
