"""CLI commands: moco (registered on import)."""
