"""Convert the image folder into shards for streaming. Run `python convert.py --help`."""

if __name__ == "__main__":
    # Imported here: processes that multiprocessing starts re-run this file's top level.
    from {{ cookiecutter.package_name }}.shards import main

    main()
