"""The one place Tandem's version is written: pyproject.toml reads it at build time
(`[tool.setuptools.dynamic]`), and `tables.__version__` is it, installed or run from a checkout."""

__version__ = "0.1.0"
