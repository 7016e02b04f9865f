#!/usr/bin/env bash
# Installs the Debian packages named as arguments that are missing (`make test` passes
# Prometheus, Alertmanager, Chromium, nginx and PostgreSQL 15: the tests start their own on
# loopback), and keeps their maintainer scripts from starting daemons on default ports while
# they install.
#
# How: a policy-rc.d that answers 101 ("action forbidden") for the length of the install.
# Debian's postinst scripts start services through invoke-rc.d or deb-systemd-invoke, and both
# ask /usr/sbin/policy-rc.d first (invoke-rc.d(8); init-system-helpers' README.policy-rc.d), so
# nothing starts and nothing needs stopping. postgresql-15's postinst is one of these: it
# creates a `main` cluster (port 5432), left stopped, then runs `invoke-rc.d postgresql start`,
# which the policy denies and which then exits 0, so the install does not fail either.
# (Stopping afterwards by name does not work:
# `pkill -x prometheus-alertmanager` can never match, a process name is cut at 15 characters.)
# A policy-rc.d already there (container images ship one) is left as it is.
#
# Environment: POLICY_RC_D overrides the policy file's path (tests).
set -euo pipefail

policy=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
missing=()
for package in "$@"; do
  dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "missing Debian packages: ${missing[*]} — run: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi

if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# Written by ttftscope tools/install_system_deps.sh for one install.\nexit 101\n' \
    | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod 755 "$policy"
  trap '"${sudo[@]}" rm -f "$policy"' EXIT
fi
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
