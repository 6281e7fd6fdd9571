"""FLARE client script of every prrfl job (copied into the job's app/custom/)."""

from prrfl.flare.site_app import main

if __name__ == "__main__":
    main()
