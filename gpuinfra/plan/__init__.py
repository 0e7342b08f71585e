"""Pulumi-free planning: what to build, before Pulumi builds it."""
