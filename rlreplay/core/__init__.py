"""The core layer: step store, item index, selectors, rate limiters and tables.

Pure numpy with optional compiled kernels; everything above it (writers, network,
runtime) builds on these. The public names are re-exported by :mod:`rlreplay`.

Modules, bottom up:

* ``spec_checks`` and ``specs`` (signatures), and ``storage`` (:class:`StepStore`, the
  ring of steps), with ``overwrite``: the one protocol that decides what happens to items
  and writers' retained steps on rows the store overwrites (its invariant is stated there);
* ``keys``, ``selectors/`` and ``item_index`` (:class:`ItemIndex`: a table's items by
  slot, with sampler, remover and size); ``item_draws``, ``gather``, ``batch_buffers``
  and ``sample`` (:class:`DrawPlan`: what a sample reads, and what it returns);
* ``rate_limiters``, ``waiting`` and ``admission`` (whether a call may proceed now, and
  its one deadline and one warning when it may not);
* ``layout`` and ``table`` (:class:`Table`, composed of the parts above), with
  ``table_checks`` (its arguments' validation) and ``table_info`` (:class:`TableInfo`).
"""
