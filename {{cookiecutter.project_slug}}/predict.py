"""Classify images: `python predict.py --model <checkpoint or artifact> <files or folders>`."""

import sys

from {{ cookiecutter.package_name }}.kit.predict import main
from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.project import project

if __name__ == "__main__":
    use(project)
    sys.exit(main())
