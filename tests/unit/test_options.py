"""One table of options: ``--help``, the settings and ``docs/configuration.md`` agree.

The reference page is made from ``kernel_worker/options/``; these fail when it was edited by
hand or not rewritten after the table changed, and when the worker reads an environment
variable the reference does not describe (or describes one nothing reads).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from kernel_worker.cli import build_parser, settings_from
from kernel_worker.options import OPTIONS, SETTINGS, documented_names, reference
from kernel_worker.options.model import settings_default
from kernel_worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
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
        assert option.shown_default, f"{option.flag} has no documented default"
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


_DEFAULT_IN_HELP = re.compile(r"\(default:? ([^;)]+)[;)]")


def test_every_default_is_written_once_in_the_settings() -> None:
    """A default comes from ``Settings``: the reference and ``--help`` show that value,
    and a command line that sets nothing makes it. A default the table still writes itself
    (a sentence, or a choice its help explains) must say the same value."""
    fields = {field.name for field in dataclasses.fields(Settings)}
    nothing_set = settings_from([], {})
    derived = 0
    for option in OPTIONS:
        if option.field not in fields:
            continue
        value = settings_default(option.field)
        if value is not None:
            assert getattr(nothing_set, option.field) == value, option.flag
        shown = option.shown_default.strip("`") if option.shown_default.count("`") == 2 else None
        in_help = _DEFAULT_IN_HELP.search(option.help)
        if option.default is None:
            derived += 1
            assert in_help is None, f"{option.flag}: its help writes the default again"
            assert f"(default {shown})" in option.help_line
        elif shown is not None and option.default.startswith("`") and value is not None:
            from_settings = dataclasses.replace(option, default=None).shown_default
            assert option.default == from_settings, f"{option.flag}: the table's default differs"
            if in_help is not None:
                assert in_help.group(1).strip() == shown, f"{option.flag}: --help differs"
    assert derived >= 15  # most options take their default from the settings alone
