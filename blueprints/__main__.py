"""Pulumi program entry (Pulumi.yaml ``main: blueprints/``)."""

from blueprints.program import main

main()
