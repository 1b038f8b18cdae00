"""Classify images: `python predict.py --model <checkpoint or artifact> <files or folders>`."""

import sys

from {{ cookiecutter.package_name }}.predict import main

if __name__ == "__main__":
    sys.exit(main())
