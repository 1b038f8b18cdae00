"""Report the software and accelerators this environment has: python -m {{ cookiecutter.package_name }}.env

Run it first when training will not start, is slow, or ignores the GPU.
"""

from .kit.env import main

if __name__ == "__main__":
    main(extra=("torchvision",))
