"""Export a checkpoint, verified: `python export.py --ckpt_path best --format onnx torch_export`."""

from {{ cookiecutter.package_name }}.kit.export import main
from {{ cookiecutter.package_name }}.kit.project import use
from {{ cookiecutter.package_name }}.project import project

if __name__ == "__main__":
    use(project)
    main()
