"""The core layer: step store, item index, selectors, rate limiters and tables.

Pure numpy with optional compiled kernels; the public names are re-exported by
:mod:`rlreplay`. See docs/code_layout.md.
"""
