"""Build hook for the optional compiled kernels; metadata lives in pyproject.toml.

The extensions are optional: without a C compiler the install still succeeds and the
package uses its numpy paths (see ``rlreplay/_compiled.py``).
"""

from setuptools import Extension, setup

COMMON = "rlreplay/_common.h"  # shared by the modules that include it

setup(
    ext_modules=[
        Extension(
            "rlreplay.selectors._sumtree",
            ["rlreplay/selectors/_sumtree.c"],
            optional=True,
        ),
        Extension(
            "rlreplay._draws", ["rlreplay/_draws.c"], depends=[COMMON], optional=True
        ),
        Extension(
            "rlreplay._slots", ["rlreplay/_slots.c"], depends=[COMMON], optional=True
        ),
        Extension(
            "rlreplay._store", ["rlreplay/_store.c"], depends=[COMMON], optional=True
        ),
    ]
)
