"""CLI commands: report (registered on import)."""
