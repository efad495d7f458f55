"""Level 2: batch tasks. 1 trigger -> N independent items -> an aggregator closes the task.

Its public names (``BatchKind``, ``Batches``, ``Item``, ``SyncBatches``...)
are exported by ``shoal``; the modules below are the layer's own.
"""

__all__: list[str] = []
