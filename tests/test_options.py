"""One table of options: ``--help``, the settings and ``docs/configuration.md`` agree.

The reference page is made from ``kernel_worker/options/``; these fail when it was edited by
hand or not rewritten after the table changed, and when the worker reads an environment
variable the reference does not describe (or describes one nothing reads).
"""

from __future__ import annotations

import re
from pathlib import Path

from kernel_worker.cli import build_parser, settings_from
from kernel_worker.options import OPTIONS, SETTINGS, documented_names, reference

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kernel_worker"
# the client reads its own variable; the token gate only removes these from kernels' sight
NOT_WORKER_SETTINGS = {"STRATA_KERNEL_WORKER_URL", "STRATA_PROXY_TOKEN",
                       "STRATA_NOTEBOOK_REMOTE_STORE_HEADERS", "STRATA_NOTEBOOK_OBJECT_CODEC"}  # fmt: skip


def _generated_section() -> str:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- options -->\n(.*)<!-- /options -->", text, re.S)
    assert match, "docs/configuration.md has lost its <!-- options --> section"
    return match.group(1)


def test_the_reference_page_is_the_option_table() -> None:
    assert _generated_section() == reference(), (
        "docs/configuration.md differs from kernel_worker/options: run "
        "`python -m kernel_worker.options docs/configuration.md`"
    )


def test_help_shows_every_option_with_its_variable() -> None:
    text = " ".join(build_parser().format_help().split())
    for option in OPTIONS:
        assert option.flag in text
        assert f"[env {option.env}]" in text


def test_every_option_reaches_the_settings_from_its_flag_and_its_variable() -> None:
    samples = {"--preload": None, "--kernel-init": None, "--kernel-user": None, "--connect": None}
    for option in OPTIONS:
        if option.flag in samples:  # need a file, root or a relay: covered in test_cli
            continue
        assert option.default, f"{option.flag} has no documented default"
        assert option.details.strip(), f"{option.flag} has no reference text"
    by_flag = settings_from(["--queue-depth", "7"], {})
    by_env = settings_from([], {"STRATA_KERNEL_WORKER_QUEUE_DEPTH": "9"})
    both = settings_from(["--queue-depth", "7"], {"STRATA_KERNEL_WORKER_QUEUE_DEPTH": "9"})
    assert (by_flag.queue_depth, by_env.queue_depth, both.queue_depth) == (7, 9, 7)


def _names_in_code() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if "options" in path.relative_to(PACKAGE).parts:
            continue
        names.update(re.findall(r'"(STRATA_[A-Z0-9_]*[A-Z0-9])"', path.read_text(encoding="utf-8")))
    return names


def test_every_variable_the_worker_reads_is_in_the_reference() -> None:
    read = _names_in_code() - NOT_WORKER_SETTINGS - {"STRATA_KERNEL_WORKER"}
    assert read - documented_names() == set()


def test_every_variable_in_the_reference_is_read() -> None:
    read = _names_in_code()
    for setting in SETTINGS:
        for name in setting.names:
            assert name in read, f"{name} is documented but nothing reads it"
