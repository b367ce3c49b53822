#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite; extra arguments go to pytest.
# The tests mostly wait on real processes, so three pytest workers (one test file each at a time:
# module fixtures such as the Slurm cluster stay single) cut the wall time on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -n "${TEST_WORKERS:-3}" --dist loadfile "$@"
