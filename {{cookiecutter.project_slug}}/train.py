"""Train, then test the best checkpoint. Run `python train.py --help` for every option."""

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.kit.project import use
    from {{ cookiecutter.package_name }}.kit.train import main
    from {{ cookiecutter.package_name }}.project import project

    use(project)
    main()
