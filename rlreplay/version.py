"""The package's version (``rlreplay.__version__``), in a module that imports nothing, so
that any part of the package (a checkpoint's manifest) can read it."""

__version__ = "0.1.0"  # as pyproject.toml's; a test holds the two equal
