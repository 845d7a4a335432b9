"""Build of the optional C extensions (Cython; everything else is in pyproject.toml):
`tables.operators._fastjoin`, the join's per-record loop (docs/tables.md, "The compiled loop"),
`tables.operators._fastwindow`, the same with the join's index in RocksDB, and
`tables.records._fastcheck`, its per-input-record check (docs/tables.md, "The compiled check").

Optional: without a C compiler or Python's headers the build warns and the package
installs without them, and tables/operators/windowed.py and tables/records/codecs.py run their pure-Python
code. Cython is a build requirement (pyproject.toml); a build without it (no build
isolation) skips the extensions.
"""

from __future__ import annotations

import warnings

from setuptools import Extension, setup

BIGENDIAN = "tables/operators/_bigendian.h"

try:
    from Cython.Build import cythonize
except ImportError:
    warnings.warn(
        "Cython is not installed: tables.operators._fastjoin, _fastwindow and _fastcheck are not built",
        stacklevel=1,
    )
    extensions = []
else:
    extensions = cythonize(
        [
            # Both include tables/operators/_bigendian.h (the keys' big-endian integers).
            Extension("tables.operators._fastjoin", ["tables/operators/_fastjoin.pyx"], depends=[BIGENDIAN]),
            Extension(
                "tables.operators._fastwindow", ["tables/operators/_fastwindow.pyx"], depends=[BIGENDIAN]
            ),
            Extension("tables.records._fastcheck", ["tables/records/_fastcheck.pyx"]),
        ],
        compiler_directives={"language_level": "3"},
    )
    for extension in extensions:
        # A failed C build warns (setuptools' build_ext) instead of failing the install. Set on
        # what cythonize returns: it makes new Extensions and drops `optional` (Cython 3.3).
        extension.optional = True

setup(ext_modules=extensions)
