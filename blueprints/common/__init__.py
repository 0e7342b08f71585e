"""Helpers shared by the cloud blueprints (naming, tags/labels)."""
