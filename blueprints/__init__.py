"""Pulumi programs of gpuinfra: ComponentResources per cloud (``blueprints.aws``,
``blueprints.gcp``) and the program entry (``blueprints.program``) that reads the stack's
cluster spec and builds the matching component."""
