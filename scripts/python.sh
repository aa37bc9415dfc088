#!/usr/bin/env bash
# Print the path of a runnable CPython >= 3.12 with venv support: the Python the worker and
# the real Strata client want. 3.12 first (what the interop tests were written against),
# then 3.13 and 3.14; looked for on PATH, through pyenv (whose shims can exist and still
# fail to run: every candidate is run, not just located), in pyenv's versions folders and in
# /usr/local/bin and /usr/bin. $STRATA_PYTHON, when set, is tried first.
#
#   "$(bash scripts/python.sh)" -m venv .venv
#
# Exits non-zero, saying where it looked, when there is none.
set -euo pipefail

usable() {
    [ -n "$1" ] && [ -x "$1" ] || return 1
    "$1" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 12) else 1)' \
        >/dev/null 2>&1
}

candidates() {
    [ -n "${STRATA_PYTHON:-}" ] && echo "$STRATA_PYTHON"
    local minor name root
    for minor in 12 13 14; do
        name="python3.$minor"
        command -v "$name" 2>/dev/null || true
        if command -v pyenv >/dev/null 2>&1; then
            pyenv which "$name" 2>/dev/null || true
        fi
        for root in "${PYENV_ROOT:-}" "$HOME/.pyenv" /root/.pyenv /opt/pyenv /usr/local/pyenv; do
            [ -n "$root" ] || continue
            ls -d "$root"/versions/3."$minor"*/bin/"$name" 2>/dev/null | sort -rV || true
        done
        echo "/usr/local/bin/$name"
        echo "/usr/bin/$name"
    done
    command -v python3 2>/dev/null || true
}

while IFS= read -r candidate; do
    if usable "$candidate"; then
        echo "$candidate"
        exit 0
    fi
done < <(candidates)
echo "python.sh: no Python >= 3.12 found (looked on PATH, through pyenv, in pyenv's versions" \
    "and in /usr/local/bin, /usr/bin); install one, or name it in STRATA_PYTHON" >&2
exit 1
