"""What the OpenAPI description says of the execute routes: their bodies and answers.

Starlette reads a route's body itself, so the framework cannot infer these; they are written
out here once and attached to the routes in :mod:`.routes`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "EXECUTE_RESPONSES",
    "MANIFEST_BODY",
    "OPENAPI_COMPONENTS",
    "multipart_body",
]

OPENAPI_COMPONENTS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["detail"],
        "properties": {
            "detail": {"type": "string"},
            "success": {"type": "boolean"},
            "error": {"type": "string"},
        },
    },
    "JobAccepted": {
        "type": "object",
        "required": ["job_url", "state"],
        "properties": {
            "job_url": {"type": "string"},
            "state": {"type": "string", "enum": ["queued", "running"]},
            "position": {"type": "integer"},
        },
    },
}
ERROR_BODY = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
BUNDLE = {
    "description": "The output bundle (gzipped tar; a cell that raised has success: false)",
    "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
}
ACCEPTED = {
    "description": "Every kernel is busy: poll job_url",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobAccepted"}}},
}
EXECUTE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: BUNDLE,
    202: ACCEPTED,
    400: {"description": "Malformed envelope, descriptor, part or name", **ERROR_BODY},
    401: {"description": "Token missing or wrong", **ERROR_BODY},
    408: {"description": "The cell exceeded timeout_seconds (504 with --timeout-status 504)"},
    409: {"description": "Cancelled", **ERROR_BODY},
    413: {"description": "An input exceeds STRATA_WORKER_MAX_INPUT_BYTES", **ERROR_BODY},
    502: {"description": "The kernel died during the cell", **ERROR_BODY},
    503: {"description": "The queue is full (Retry-After)", **ERROR_BODY},
}


def multipart_body(envelope: str) -> dict[str, Any]:
    """The OpenAPI request body of a push route: a metadata file part plus input parts."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["metadata"],
                        "properties": {
                            "metadata": {
                                "type": "string",
                                "format": "binary",
                                "description": f"A JSON file part: the {envelope} envelope",
                            }
                        },
                        "additionalProperties": {
                            "type": "string",
                            "format": "binary",
                            "description": "One file part per input, named by its file name "
                            "(e.g. df.arrow) or its variable name",
                        },
                    }
                }
            },
        }
    }


MANIFEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["metadata", "inputs", "output", "finalize_url"],
                    "properties": {
                        "build_id": {"type": "string"},
                        "metadata": {"type": "object"},
                        "inputs": {"type": "array", "items": {"type": "object"}},
                        "output": {"type": "object"},
                        "finalize_url": {"type": "string"},
                        "log_url": {"type": "string"},
                        "output_file_url": {"type": "string"},
                    },
                }
            }
        },
    }
}
