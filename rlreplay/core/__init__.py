"""The core layer: step store, item index, selectors, rate limiters and tables.

Pure numpy with optional compiled kernels; everything above it (writers, network,
runtime) builds on these. The public names are re-exported by :mod:`rlreplay`.
"""
