"""Level 2: batch tasks. 1 trigger -> N independent items -> an aggregator closes the task."""
