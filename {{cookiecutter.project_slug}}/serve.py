"""Serve a model over HTTP: `python serve.py --model <artifact or checkpoint> [--port 8000]`."""

from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.kit.serve import main
from {{ cookiecutter.package_name }}.project import project

if __name__ == "__main__":
    use(project)
    main()
