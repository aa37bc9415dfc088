#!/usr/bin/env bash
# Build (or reuse) the Python >= 3.12 environment that holds the real Strata client
# (strata-notebook 0.11, whose client and reference worker need Python >= 3.12), and print
# its interpreter's path: the value for STRATA_INTEROP_PYTHON.
#
#   export STRATA_INTEROP_PYTHON="$(scripts/interop-env.sh)"
#   .venv/bin/python -m pytest
#
# Usage: scripts/interop-env.sh [VENV_DIR]
#
# VENV_DIR defaults to $STRATA_INTEROP_VENV, else .venv-interop/ at the repository root
# (git-ignored; tests/conftest.py uses it when STRATA_INTEROP_PYTHON is unset). An existing
# environment is reused only if it works: its Python is >= 3.12, the client, pandas and uv
# import or run, and it was built from the same package spec. Otherwise it is rebuilt from
# scratch.
#
# Environment:
#   STRATA_INTEROP_BASE_PYTHON  the Python >= 3.12 to build from (default: searched for)
#   STRATA_NOTEBOOK_SPEC        what to install (default: strata-notebook[notebook,otel]==0.11.*;
#                               otel: the client's traces, for the trace interop test)
#
# Only the interpreter path goes to stdout; progress goes to stderr. Exits non-zero, with
# the reason, when no Python >= 3.12 is found or the install fails: it never hands back an
# environment that cannot run the interop tests.
set -euo pipefail

SPEC="${STRATA_NOTEBOOK_SPEC:-strata-notebook[notebook,otel]==0.11.*}"
# uv: the interop test that drives the real `strata` CLI makes uv-created environments.
PACKAGES=("$SPEC" "uv" "polars")
STAMP_NAME=".strata-interop-stamp"

say() { printf 'interop-env: %s\n' "$*" >&2; }
die() {
    say "ERROR: $*"
    exit 1
}

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${STRATA_INTEROP_VENV:-$REPO/.venv-interop}}"
STAMP="${PACKAGES[*]}"

# True if "$1" is a runnable CPython >= 3.12 with venv support. (A pyenv shim on PATH can
# exist and still fail to run, so every candidate is executed, not just located.)
usable() {
    [ -n "$1" ] && [ -x "$1" ] || return 1
    "$1" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 12) else 1)' \
        >/dev/null 2>&1
}

# The Python to build from: $STRATA_INTEROP_BASE_PYTHON, else what scripts/python.sh finds.
find_base_python() {
    if [ -n "${STRATA_INTEROP_BASE_PYTHON:-}" ] && usable "$STRATA_INTEROP_BASE_PYTHON"; then
        echo "$STRATA_INTEROP_BASE_PYTHON"
        return 0
    fi
    bash "$REPO/scripts/python.sh" 2>/dev/null
}

# True if the environment at $VENV is complete and was built from the current spec.
works() {
    local py="$VENV/bin/python"
    [ -f "$VENV/$STAMP_NAME" ] && [ "$(cat "$VENV/$STAMP_NAME")" = "$STAMP" ] || return 1
    usable "$py" || return 1
    [ -x "$VENV/bin/uv" ] && "$VENV/bin/uv" --version >/dev/null 2>&1 || return 1
    "$py" - "$SPEC" >/dev/null 2>&1 <<'EOF'
import importlib.metadata
import sys

from packaging.requirements import Requirement

import pandas  # noqa: F401
import polars  # noqa: F401
import pyarrow  # noqa: F401
import strata.notebook.executor  # noqa: F401
import strata.notebook.remote_bundle  # noqa: F401

if "otel" in sys.argv[1]:  # the client's tracing, and an OTLP/HTTP exporter for the test
    import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
    import opentelemetry.sdk.trace  # noqa: F401

requirement = Requirement(sys.argv[1])
version = importlib.metadata.version(requirement.name)
sys.exit(0 if requirement.specifier.contains(version, prereleases=True) else 1)
EOF
}

if works; then
    say "reusing $VENV"
else
    BASE="$(find_base_python)" || die "no Python >= 3.12 found (looked on PATH, in pyenv's \
versions and in /usr/bin, /usr/local/bin); install one or set STRATA_INTEROP_BASE_PYTHON. \
The interop tests need it: they are not skipped."
    say "building $VENV from $BASE ($("$BASE" -V 2>&1)) with: ${PACKAGES[*]}"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$BASE" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PACKAGES[@]}" >&2 \
        || die "pip could not install ${PACKAGES[*]} into $VENV"
    printf '%s' "$STAMP" >"$VENV/$STAMP_NAME"
    works || die "$VENV was built but does not work (import strata.notebook / pandas / polars / uv)"
fi

say "$("$VENV/bin/python" -c 'import importlib.metadata as m, sys;
print("strata-notebook", m.version("strata-notebook"), "on Python", sys.version.split()[0])')"
echo "$VENV/bin/python"
