#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: installs the system tools some tests
# drive (systemd-analyze for the documented unit, a PostgreSQL server the store tests
# start and throw away) when they are missing, then runs
# `cargo test`. Plain `cargo test` works where they are installed, and a test whose
# tool is missing fails naming the package, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)

if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]] && ! command -v sudo >/dev/null 2>&1; then
    echo "missing: ${missing[*]}; install with: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "installing ${missing[*]} (Debian packages)..." >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

exec cargo test "$@"
