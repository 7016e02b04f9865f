#!/usr/bin/env bash
# Installs the lock's torch, the CPU build, into a virtualenv.
# usage: tools/install_torch.sh VENV_PYTHON LOCK_FILE
#
# PyPI's Linux torch wheel is the CUDA build (several GB of nvidia-* wheels); the CPU build,
# `torch==X+cpu` as the lock pins it, is only on PyTorch's own index (TORCH_INDEX_URL). So:
#  1. a CPU wheel pip can already see without an index (installed, or in a --find-links
#     folder) is taken with no network at all;
#  2. otherwise PyTorch's CPU index is asked first, with a short time limit, so that a
#     machine that cannot reach it fails in seconds with a clear message rather than through
#     pip's retries (minutes), and then pip installs from it, its dependencies from PyPI.
set -euo pipefail
vpy=$1 lock=$2
index=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
probe_timeout_s=${TORCH_INDEX_PROBE_TIMEOUT_S:-10}
spec=$(grep -E '^torch==' "$lock" || true)
if [ -z "$spec" ]; then
  echo "error: $lock pins no torch (expected a line torch==VERSION+cpu)" >&2
  exit 1
fi
pip=("$vpy" -m pip install -q -c "$lock")

# 1. No index: the wheel itself must be at hand. Its dependencies then come from the usual
#    indexes, torch being satisfied already.
if "${pip[@]}" --no-index --no-deps "$spec" >/dev/null 2>&1; then
  exec "${pip[@]}" "$spec"
fi

# 2. PyTorch's CPU index, probed once.
if ! "$vpy" - "$index" "$probe_timeout_s" <<'PY'
import sys, urllib.request
url, timeout_s = sys.argv[1].rstrip("/") + "/torch/", float(sys.argv[2])
try:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception as e:   # DNS, refused, time-out, TLS: all mean "not reachable from here"
    print(f"  {url}: {e}", file=sys.stderr)
    sys.exit(1)
PY
then
  echo "error: $spec is the CPU build of torch, which PyPI does not carry, and PyTorch's" \
       "CPU index ($index) cannot be reached from this machine." >&2
  echo "  Either let this machine reach it, point TORCH_INDEX_URL at a mirror of it, or" \
       "download the wheel elsewhere and pass its folder with PIP_FIND_LINKS=DIR." >&2
  exit 1
fi
exec "${pip[@]}" --extra-index-url "$index" "$spec"
