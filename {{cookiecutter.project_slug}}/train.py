"""Train, then test the best checkpoint. Run `python train.py --help` for every option."""

from {{ cookiecutter.package_name }}.train import main

if __name__ == "__main__":
    main()
