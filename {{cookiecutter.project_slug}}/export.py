"""Export a checkpoint, verified: `python export.py --ckpt_path best --format onnx torch_export`."""

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.kit.export import main
    from {{ cookiecutter.package_name }}.kit.project import use
    from {{ cookiecutter.package_name }}.project import project

    use(project)
    main()
