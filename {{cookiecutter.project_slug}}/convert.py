"""Convert the image folder into shards for streaming. Run `python convert.py --help`."""

from {{ cookiecutter.package_name }}.shards import main

if __name__ == "__main__":
    main()
