"""Serve a model over HTTP: `python serve.py --model <artifact or checkpoint> [--port 8000]`."""

from {{ cookiecutter.package_name }}.serve import main

if __name__ == "__main__":
    main()
