"""CLI commands: bench (registered on import)."""
