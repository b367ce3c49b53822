#!/usr/bin/env bash
# Set up (if needed), lint, and run the whole test suite; extra arguments go to pytest.
# ruff first (check and format --check, config in pyproject.toml): a lint failure ends the run at once.
# The tests mostly wait on real processes (timeouts, heartbeats, Slurm), so pytest runs four workers
# a core, 12 at most (one test file each at a time: module fixtures such as the Slurm cluster stay
# single; the longest files first, tests/support/schedule.py); on 2 cores 5 workers took 660 s where 3
# took 808 s, and beside two busy loops 6 took 657 s where 5 took 693 s; with 6, ~4 of them had work
# for a core at a time (the rest waited on a timer or a peer). TEST_WORKERS overrides.
# Layers: tests/unit (in process, seconds), tests/integration, tests/e2e; e.g. `scripts/test.sh tests/unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
LINTED=(launcher tests scripts examples)
.venv/bin/ruff check "${LINTED[@]}"
.venv/bin/ruff format --check "${LINTED[@]}"
# Bytecode, fresh: where PYTHONDONTWRITEBYTECODE=1 no process writes it, and each of the suite's
# launcher, zygote and worker processes compiled what it imports again (setup.sh writes it at install).
.venv/bin/python -m compileall -q -j 0 launcher tests >/dev/null
# pytest rewrites each test module's asserts as it imports it (~10 s of CPU for the suite), and every
# xdist worker imports every module: two processes write the rewritten modules first (tests/conftest.py
# lets a pytest process write them where PYTHONDONTWRITEBYTECODE is set), and the workers then read them
# (a fresh clone has none; a collection error is reported by the run itself).
pytest_cache_write() { .venv/bin/python -m pytest -q --collect-only -p no:cacheprovider "$@" >/dev/null 2>&1 || true; }
pytest_cache_write tests/e2e &
pytest_cache_write tests/unit tests/integration
wait
cores=$(nproc 2>/dev/null || echo 2)
exec .venv/bin/python -m pytest -q -n "${TEST_WORKERS:-$((cores * 4 > 12 ? 12 : cores * 4))}" --dist loadfile "$@"
