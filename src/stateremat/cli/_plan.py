"""CLI commands: plan (registered on import)."""
