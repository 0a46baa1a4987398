"""CLI commands: cohort (registered on import)."""
