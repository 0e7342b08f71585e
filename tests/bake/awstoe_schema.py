"""JSON schema of an AWSTOE component document, written from its documented structure
(docs.aws.amazon.com/imagebuilder/latest/userguide/toe-use-documents.html, "Document schema and
definitions": top-level ``name``, ``description``, ``schemaVersion`` (1.0), ``parameters``,
``phases``; each phase a unique ``name`` among build/validate/test and its ``steps``; each step
``name``, ``action``, optional ``timeoutSeconds``, ``onFailure`` (Abort | Continue | Ignore),
``maxAttempts``, ``inputs``; toe-action-modules.html: ``ExecuteBash`` takes ``inputs.commands``
(a list of strings), ``Reboot`` no required input). No schema is published by AWS; this one
encodes only what those pages state."""

STEP_NAME = r"^[A-Za-z0-9_]+$"

SCHEMA = {
    "type": "object",
    "required": ["schemaVersion", "phases"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "description": {"type": "string"},
        "schemaVersion": {"enum": [1.0, "1.0"]},
        "parameters": {
            "type": "array",
            "items": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "additionalProperties": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {
                        "type": {"enum": ["string"]},
                        "default": {"type": "string"},
                        "description": {"type": "string"},
                    },
                },
            },
        },
        "phases": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "steps"],
                "additionalProperties": False,
                "properties": {
                    "name": {"enum": ["build", "validate", "test"]},
                    "steps": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "action"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string", "pattern": STEP_NAME},
                                "action": {"enum": ["ExecuteBash", "Reboot"]},
                                "timeoutSeconds": {"type": "integer", "minimum": 1},
                                "onFailure": {"enum": ["Abort", "Continue", "Ignore"]},
                                "maxAttempts": {"type": "integer", "minimum": 1},
                                "inputs": {"type": "object"},
                            },
                            "allOf": [
                                {
                                    "if": {"properties": {"action": {"const": "ExecuteBash"}}},
                                    "then": {
                                        "required": ["inputs"],
                                        "properties": {
                                            "inputs": {
                                                "type": "object",
                                                "required": ["commands"],
                                                "properties": {
                                                    "commands": {
                                                        "type": "array",
                                                        "minItems": 1,
                                                        "items": {"type": "string"},
                                                    }
                                                },
                                            }
                                        },
                                    },
                                }
                            ],
                        },
                    },
                },
            },
        },
    },
}
