"""Level 1: durable jobs with pg-boss semantics."""
