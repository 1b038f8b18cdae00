"""Export a checkpoint, verified: `python export.py --ckpt_path best --format onnx torch_export`."""

from {{ cookiecutter.package_name }}.export import main

if __name__ == "__main__":
    main()
