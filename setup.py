"""Build hook for the optional compiled kernels; metadata lives in pyproject.toml.

The extensions are optional: without a C compiler the install still succeeds and the
package uses its numpy paths (see ``rlreplay/core/_compiled.py``).
"""

from setuptools import Extension, find_packages, setup

COMMON = "rlreplay/core/_common.h"  # shared by the modules that include it

setup(
    # The learning examples (examples/*.py, single readable files) also install as
    # rlreplay.examples, so `rlreplay demo` can run them from an installed package.
    # rlreplay/examples is a link to examples/, so a source checkout has the installed
    # layout: a process that imports rlreplay from the checkout (a Ray worker started in
    # it, whose path begins with the driver's directory) finds rlreplay.examples too,
    # without the editable install's import hook.
    packages=find_packages(include=["rlreplay", "rlreplay.*"]),
    package_data={"rlreplay.examples": ["tables.toml"]},
    ext_modules=[
        Extension(
            "rlreplay.core.selectors._sumtree",
            ["rlreplay/core/selectors/_sumtree.c"],
            optional=True,
        ),
        Extension(
            "rlreplay.core._draws", ["rlreplay/core/_draws.c"], depends=[COMMON], optional=True
        ),
        Extension(
            "rlreplay.core._slots", ["rlreplay/core/_slots.c"], depends=[COMMON], optional=True
        ),
        Extension(
            "rlreplay.core._store", ["rlreplay/core/_store.c"], depends=[COMMON], optional=True
        ),
        Extension("rlreplay.writers._blocks", ["rlreplay/writers/_blocks.c"], optional=True),
        Extension(
            "rlreplay.integrations._sb3_transitions",
            ["rlreplay/integrations/_sb3_transitions.c"],
            depends=[COMMON],
            optional=True,
        ),
    ]
)
