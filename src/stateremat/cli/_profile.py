"""CLI commands: profile (registered on import)."""
