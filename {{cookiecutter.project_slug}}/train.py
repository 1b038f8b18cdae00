"""Train, then test the best checkpoint. Run `python train.py --help` for every option."""

from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.kit.train import main
from {{ cookiecutter.package_name }}.project import project

if __name__ == "__main__":
    use(project)
    main()
