"""Options of one run: where its directory is made, and the caps on what it may print,
unpack, display and return."""

from __future__ import annotations

from pathlib import Path

from .model import Option
from .parsing import ENV_PREFIX, compresslevel, positive_int, size, size_or_zero

__all__ = ["OPTIONS"]

OPTIONS: tuple[Option, ...] = (
    Option(
        "--run-dir",
        f"{ENV_PREFIX}RUN_DIR",
        Path,
        "where per-request directories are made (default: /dev/shm when it is a tmpfs with 2 GiB "
        "free, else the system temp dir)",
        default="`/dev/shm` if a tmpfs with 2 GiB free, else the system temp dir",
        details=(
            "Where per-request directories are made; made at start-up when missing (and again if "
            "removed while serving). A full filesystem there answers `507` with a `detail`."
        ),
    ),
    Option(
        "--console-cap",
        f"{ENV_PREFIX}CONSOLE_CAP",
        size,
        "characters of stdout/stderr kept per stream",
        details=(
            "Characters of stdout/stderr kept per stream; beyond it a truncation marker. The cap "
            "is per stream and per cell, and the marker, `[output truncated: N more characters "
            "not kept]` at the end of the stream, counts every character not kept (characters, "
            "not bytes: a subprocess's bytes count as the characters they decode to). It is "
            "applied in the kernel: past it the cell's streams publish nothing more, for `print`,"
            " `sys.stdout`/`sys.stderr` and what its processes write to file descriptors 1 and 2 "
            "alike, and the kernel only counts what it drops. A cell printing 1 GB grows the "
            "worker by about 24 MiB with the default cap, and whatever a kernel sends, the worker"
            " keeps at most the cap per stream and reads only a few messages ahead (see `python "
            "-m bench.hostile`)."
        ),
    ),
    Option(
        "--max-folder-input-bytes",
        f"{ENV_PREFIX}MAX_FOLDER_INPUT_BYTES",
        size,
        "bytes a folder input (dir/tar) may unpack to, checked as it unpacks; past it the cell "
        "fails naming the cap (default: the input cap, STRATA_WORKER_MAX_INPUT_BYTES)",
        default="the input cap (`STRATA_WORKER_MAX_INPUT_BYTES`, 2 GiB)",
        details=(
            "Bytes a folder input (`dir/tar`) may unpack to. The input cap bounds only what is "
            "sent, and a compressed archive can hold far more (1 MB of gzip unpacks to 1 GiB of "
            "zeros, on a run root in memory by default). Each member is checked before it is "
            "written; one that passes the cap fails the cell (`Error deserializing folder: "
            "Refusing to unpack the folder: it holds more than 2 GiB, the cap on a folder input "
            "(--max-folder-input-bytes; 'zeros.bin' passes it)`) and what was unpacked is "
            "removed."
        ),
    ),
    Option(
        "--max-folder-input-entries",
        f"{ENV_PREFIX}MAX_FOLDER_INPUT_ENTRIES",
        positive_int,
        "files, folders and links a folder input (dir/tar) may unpack to",
        details=(
            "Files, folders and links a folder input may unpack to (0.6 MB of gzip holds 100,000 "
            "empty files); past it the cell fails the same way, naming this cap."
        ),
    ),
    Option(
        "--max-display-bytes",
        f"{ENV_PREFIX}MAX_DISPLAY_BYTES",
        size,
        "bytes of one display, all its formats together; a larger one is dropped and a note says "
        "so",
        details=(
            "Bytes of one display, all its formats together. A larger one is dropped: a marker "
            "takes its place in both display views (see "
            "[The output bundle](protocol.md#the-output-bundle))."
        ),
    ),
    Option(
        "--max-run-display-bytes",
        f"{ENV_PREFIX}MAX_RUN_DISPLAY_BYTES",
        size,
        "bytes of all the displays a run keeps; a display past it is dropped and a note says so",
        details=(
            "Bytes of all the displays a run keeps (in each display view): a display that would "
            "pass it is dropped the same way. A display another replaces (`update_display`) or "
            "clears (`clear_output`) stops counting."
        ),
    ),
    Option(
        "--max-output-dir-files",
        f"{ENV_PREFIX}MAX_OUTPUT_DIR_FILES",
        positive_int,
        "files a run's # @output_dir folders return, all folders together; the rest are left out "
        "and the answer says so",
        details=(
            "Files a run's `# @output_dir` folders return, all folders together (each is a bundle"
            " member and a manifest entry: 50,000 made a 0.8 MB manifest). The first found are "
            'returned; the manifest\'s `output_dirs_truncated` (`{"folders", "max_files", '
            '"limit"}`) and a line in stderr say the rest were left out.'
        ),
    ),
    Option(
        "--file-reuse-bytes",
        f"{ENV_PREFIX}FILE_REUSE_BYTES",
        size_or_zero,
        "on a memory filesystem, large files of finished runs kept (up to this many bytes, for 60"
        " s) so later large inputs and outputs are written over their pages instead of new ones "
        "(default 256M; 0: off; always off with --kernel-user)",
        default="`256M`",
        details=(
            "On a memory filesystem run root (the default), large files (≥ 1 MiB) of finished "
            "runs are kept, up to this many bytes and for 60 s, and a later large input (pushed "
            "or downloaded), a large Arrow output the kernel writes, or a pull run's bundle file "
            "goes over one of them instead of new pages: a request with a 100 MB input ~16 % "
            "faster end to end, one with a 100 MB output 4-13 %. A file another process still has"
            " open or mapped (an Arrow table a cell kept) is never kept. `0`: off. Off with "
            "`--kernel-user`."
        ),
    ),
    Option(
        "--bundle-compresslevel",
        f"{ENV_PREFIX}BUNDLE_COMPRESSLEVEL",
        compresslevel,
        "gzip level of result bundles, 0 (stored) to 9 (default: 2 or stored, chosen per bundle "
        "by whether its largest output compresses)",
        default="chosen per bundle",
        details=(
            "gzip level of result bundles, `0` (stored) to `9`. By default small bundles get "
            "level 2 and large ones are stored unless a sample of their largest output compresses"
            " well (see [The output bundle](protocol.md#the-output-bundle))."
        ),
    ),
)
