"""Search hyperparameters with Optuna. Run `python sweep.py --help` for the options."""

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.kit.project import use
    from {{ cookiecutter.package_name }}.kit.sweep import run
    from {{ cookiecutter.package_name }}.project import project

    use(project)
    run()
