"""Shipping packages into kernels as sources (kernel_pool.shipping), without a kernel: the
load code in a fresh interpreter that has no site-packages (as a kernel's environment may
lack everything the worker has)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_pool import KernelSetup, ShippedPackage
from kernel_pool.shipping import INKERNEL, load_code
from tests.setups import kernel_setup


def _run_isolated(code: str) -> str:
    """Run ``code`` in ``python -I -S``: no site-packages, no environment, no cwd on the path."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-"], input=code, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_in_kernel_package_imports_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        f"exec({load_code((INKERNEL,))!r})\n"
        "import json\n"
        "new = sorted(m for m in set(sys.modules) - before\n"
        "             if not m.startswith('kernel_pool_') and m.partition('.')[0] not in sys.stdlib_module_names)\n"
        "ours = sorted(m for m in sys.modules if m.startswith('kernel_pool_inkernel'))\n"
        "print(json.dumps([new, ours]))\n"
    )
    new, ours = json.loads(_run_isolated(code))
    assert new == []  # nothing from outside the standard library
    modules = sorted(p.stem for p in Path(INKERNEL.source).glob("*.py") if p.stem != "__init__")
    assert ours == ["kernel_pool_inkernel", *(f"kernel_pool_inkernel.{m}" for m in modules)]


def test_loading_twice_loads_once_and_relative_imports_resolve() -> None:
    setup = kernel_setup(
        "from .values import answer\nfrom .sub import deeper\n",
        install=False,
        modules={"values.py": "import os\nanswer = 42\nloaded_in = os.getpid()\n"},
    )
    package = setup.packages[0]
    (package.source / "sub").mkdir()
    (package.source / "sub" / "__init__.py").write_text("from ..values import answer as deeper\n")
    code = load_code(setup.packages)
    out = _run_isolated(
        f"exec({code!r})\nimport sys\nfirst = sys.modules[{package.name!r}]\n"
        f"exec({code!r})\nsecond = sys.modules[{package.name!r}]\n"
        "print(first is second, first.answer, first.deeper, first.sub.__path__ == [])\n"
    )
    assert out == "True 42 42 True\n"


def test_a_shipped_modules_file_name_is_its_module_name() -> None:
    """What tracebacks and profiles show (and the agent's traceback filter looks for)."""
    setup = kernel_setup("def fail():\n    raise ValueError('here')\n", install=False)
    name = setup.packages[0].name
    out = _run_isolated(
        f"exec({load_code(setup.packages)!r})\nimport sys, traceback\n"
        f"try:\n    sys.modules[{name!r}].fail()\n"
        "except ValueError as exc:\n    print(traceback.extract_tb(exc.__traceback__)[-1].filename)\n"
    )
    assert out == f"<{name}>\n"


@pytest.mark.parametrize(
    "install", ["module", "module:", ":function", "a.b:c d", "a:b:c"], ids=repr
)
def test_an_install_target_must_name_a_function_of_a_module(install: str) -> None:
    with pytest.raises(ValueError, match=r"package\.module:function"):
        KernelSetup(install=install)


def test_shipped_packages_have_names_of_their_own(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="top-level"):
        ShippedPackage("a.b", tmp_path)
    with pytest.raises(ValueError, match="names of their own"):
        KernelSetup(packages=(ShippedPackage(INKERNEL.name, tmp_path),))
    with pytest.raises(ValueError, match="names of their own"):
        KernelSetup(packages=(ShippedPackage("x", tmp_path), ShippedPackage("x", tmp_path)))
