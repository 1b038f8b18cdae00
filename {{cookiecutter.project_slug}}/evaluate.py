"""Test a checkpoint: `python evaluate.py --ckpt_path best|last|<file>`; metrics go to its run."""

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.kit.evaluate import main
    from {{ cookiecutter.package_name }}.kit.project import use
    from {{ cookiecutter.package_name }}.project import project

    use(project)
    main()
