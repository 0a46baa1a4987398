"""CLI commands: verify (registered on import)."""
