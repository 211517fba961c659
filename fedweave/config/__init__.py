"""One config for every command (filled in below)."""
