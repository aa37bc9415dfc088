"""The caps on what one run may unpack, display and return: one frozen value per worker.

:class:`RunLimits` is built from the settings (``--max-folder-input-bytes``,
``--max-folder-input-entries``, ``--max-display-bytes``, ``--max-run-display-bytes``,
``--max-output-dir-files``) and read where each cap holds: the in-kernel agent gets the
folder-input and display caps in the run plan (it unpacks folder inputs and writes display
files), the IOPub reducer holds displays to them again (whatever a kernel sends), the output
folders' listing stops at its file count. ``/health`` reports them, so a client can size what
it sends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..agent.plan import KernelLimits
from .displays import DisplayCaps

__all__ = [
    "DEFAULT_MAX_DISPLAY_BYTES",
    "DEFAULT_MAX_FOLDER_INPUT_ENTRIES",
    "DEFAULT_MAX_OUTPUT_DIR_FILES",
    "DEFAULT_MAX_RUN_DISPLAY_BYTES",
    "RunLimits",
]

DEFAULT_MAX_FOLDER_INPUT_ENTRIES = 50_000
DEFAULT_MAX_DISPLAY_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_RUN_DISPLAY_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_OUTPUT_DIR_FILES = 10_000


@dataclass(frozen=True, slots=True)
class RunLimits:
    """What one run may unpack (folder inputs), display and return (output folders)."""

    folder_input_bytes: int = 2 * 1024**3
    """Bytes a ``dir/tar`` input may unpack to (by default the input cap)."""
    folder_input_entries: int = DEFAULT_MAX_FOLDER_INPUT_ENTRIES
    """Entries (files, folders, links) a ``dir/tar`` input may unpack to."""
    display_bytes: int = DEFAULT_MAX_DISPLAY_BYTES
    """Bytes of one display (all its formats together)."""
    run_display_bytes: int = DEFAULT_MAX_RUN_DISPLAY_BYTES
    """Bytes of all the displays a run keeps, in each of the bundle's two display views."""
    output_dir_files: int = DEFAULT_MAX_OUTPUT_DIR_FILES
    """Files a run's ``# @output_dir`` folders return, all folders together."""

    def __post_init__(self) -> None:
        for cap in dataclasses.fields(self):
            if getattr(self, cap.name) < 1:
                raise ValueError(f"{cap.name.replace('_', ' ')} must be at least 1")

    @property
    def display_caps(self) -> DisplayCaps:
        return DisplayCaps(self.display_bytes, self.run_display_bytes)

    def for_kernel(self) -> KernelLimits:
        """The caps the in-kernel agent applies (the run plan's ``limits``)."""
        return KernelLimits(
            folder_input_bytes=self.folder_input_bytes,
            folder_input_entries=self.folder_input_entries,
            display_bytes=self.display_bytes,
            run_display_bytes=self.run_display_bytes,
        )

    def described(self) -> dict[str, int]:
        """The caps as ``/health`` reports them."""
        return {
            "max_folder_input_bytes": self.folder_input_bytes,
            "max_folder_input_entries": self.folder_input_entries,
            "max_display_bytes": self.display_bytes,
            "max_run_display_bytes": self.run_display_bytes,
            "max_output_dir_files": self.output_dir_files,
        }
