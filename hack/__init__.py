"""Developer tools run from the repository root as modules (``python -m hack.demo``), so they import
``devkit`` and each other as packages, with no ``sys.path`` edits (see the Makefile)."""
