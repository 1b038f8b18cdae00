"""Samples per second of the default model and data at each precision on one CUDA GPU:
`python scripts/gpu_check.py [--steps 200] [--batch_size 256]`."""

import sys

if __name__ == "__main__":
    from {{ cookiecutter.package_name }}.kit.gpu_check import main
    from {{ cookiecutter.package_name }}.kit.project import use
    from {{ cookiecutter.package_name }}.project import project

    use(project)
    sys.exit(main())
