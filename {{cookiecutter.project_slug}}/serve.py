"""Serve a model over HTTP: `python serve.py --model <artifact or checkpoint> [--port 8000]`."""

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.kit.project import use
    from {{ cookiecutter.package_name }}.kit.serve import main
    from {{ cookiecutter.package_name }}.project import project

    use(project)
    main()
