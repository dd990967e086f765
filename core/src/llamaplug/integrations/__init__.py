"""Integrations with other serving systems (each imports its system lazily: the core never needs it installed)."""
