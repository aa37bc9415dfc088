"""The protocol's names: its versions, the transform it runs, the bundle format, and the
headers that say so on every bundle answer."""

from __future__ import annotations

__all__ = [
    "BUNDLE_HEADERS",
    "EXECUTOR_PROTOCOL",
    "NOTEBOOK_PROTOCOL",
    "OUTPUT_FORMAT",
    "TRANSFORM_REF",
]

EXECUTOR_PROTOCOL = "v1"
NOTEBOOK_PROTOCOL = "notebook-cell-v1"
TRANSFORM_REF = "notebook_cell@v1"
OUTPUT_FORMAT = "notebook-output-bundle@v1"
BUNDLE_HEADERS = {
    "X-Strata-Executor-Protocol": EXECUTOR_PROTOCOL,
    "X-Strata-Notebook-Executor-Protocol": NOTEBOOK_PROTOCOL,
    "X-Strata-Output-Format": OUTPUT_FORMAT,
}
