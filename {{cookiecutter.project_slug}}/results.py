"""List, diff and compare runs. Run `python results.py --help` for the options."""

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.kit.results import main

    main()
