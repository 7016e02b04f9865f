#!/usr/bin/env bash
# Creates the project's virtualenv with a Python that can run it, or says clearly why not.
# usage: tools/bootstrap_venv.sh PYTHON VENV_DIR
# A fresh Debian or Ubuntu has python3 without venv/ensurepip; an older distribution has a
# Python below 3.11 (pyproject's requires-python): both would otherwise fail deep inside pip.
set -euo pipefail
py=$1 venv=$2
if [ -x "$venv/bin/python" ]; then exit 0; fi
if ! command -v "$py" >/dev/null 2>&1; then
  echo "error: '$py' not found. ttftscope needs Python 3.11 or newer: install it" \
       "(Debian/Ubuntu: apt-get install python3 python3-venv) or run make with PY=/path/to/python3.11" >&2
  exit 1
fi
if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "error: $("$py" --version 2>&1) is too old: ttftscope needs Python 3.11 or newer." \
       "Install one and run make with PY=/path/to/python3.11 (or newer)." >&2
  exit 1
fi
if ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "error: $("$py" --version 2>&1) has no venv/ensurepip module." \
       "On Debian/Ubuntu: apt-get install python3-venv (or python3.11-venv)." >&2
  exit 1
fi
"$py" -m venv "$venv"
