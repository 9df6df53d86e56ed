"""Build hook for the optional compiled sum-tree kernel; metadata lives in pyproject.toml.

The extension is optional: without a C compiler the install still succeeds and
``rlreplay.selectors.sum_tree`` uses its numpy path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rlreplay.selectors._sumtree",
            ["rlreplay/selectors/_sumtree.c"],
            optional=True,
        )
    ]
)
