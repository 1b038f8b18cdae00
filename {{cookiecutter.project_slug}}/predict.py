"""Classify images: `python predict.py --model <checkpoint or artifact> <files or folders>`."""

import sys

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.kit.predict import main
    from {{ cookiecutter.package_name }}.kit.project import use
    from {{ cookiecutter.package_name }}.project import project

    use(project)
    sys.exit(main())
