"""Level 1: durable jobs with pg-boss semantics.

Its public names (``Shoal``, ``Job``, ``SyncClient``, ``Worker``...) are
exported by ``shoal``; the modules below are the layer's own.
"""

__all__: list[str] = []
