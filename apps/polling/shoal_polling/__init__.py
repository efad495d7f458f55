"""shoal-polling: the card polling reference application (seed 001) on shoal's public API."""
