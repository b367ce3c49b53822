#!/usr/bin/env bash
# Run pytorch's own launcher tests (test/distributed/launcher/test_run.py and launch_test.py, with
# their bin/ scripts) against `python -m launcher`, from outside the tree.
#
#   scripts/torch_launcher_tests.sh PATH/TO/pytorch/test/distributed/launcher [pytest args...]
#
# The files are copied to a temporary folder and one import in each is swapped for
# scripts/torch_tests/torchrun_shim.py, which runs our CLI and maps exit 0 / 2 / other onto
# torchrun's return / ValueError / ChildFailedError. Tests that mock torch's internals (the agent,
# the event recorder, the rendezvous registry, the accelerator counts) are left out: they test
# torch's code, not the command line. None of torch's test code is kept in this repository.
set -euo pipefail
src=${1:?usage: $0 PATH/TO/pytorch/test/distributed/launcher [pytest args...]}
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
# torch.testing._internal.common_utils needs expecttest (a test-only dependency of pytorch)
"$py" -c "import expecttest" 2>/dev/null || "$py" -m pip install -q --disable-pip-version-check expecttest
work=$(mktemp -d /tmp/torch-launcher-tests.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$src"/. "$work"/
sed -i 's/^import torch\.distributed\.run as launch$/import torchrun_shim as launch/' "$work/test_run.py"
sed -i 's/^import torch\.distributed\.launch as launch$/from torchrun_shim import legacy as launch/' "$work/launch_test.py"
grep -q '^import torchrun_shim as launch$' "$work/test_run.py" || { echo "test_run.py: import not found" >&2; exit 2; }
grep -q '^from torchrun_shim import legacy as launch$' "$work/launch_test.py" || { echo "launch_test.py: import not found" >&2; exit 2; }
chmod +x "$work"/bin/*.sh 2>/dev/null || true
mocked=(
    test_nproc_gpu_launch_configurations        # patches torch.cuda/torch.accelerator counts
    test_nproc_xpu_launch_configurations        # patches torch.xpu/torch.accelerator counts
    test_launch_elastic_worker_raise_exception  # asserts torch.distributed.elastic.events.record was called
    test_launch_elastic_agent_raise_exception   # patches LocalElasticAgent.run
    test_launch_shutdown                        # patches LocalElasticAgent and the rendezvous registry
)
deselect=()
for t in "${mocked[@]}"; do deselect+=(--deselect "test_run.py::ElasticLaunchTest::$t"); done
cd "$work"
PYTHONPATH="$repo/scripts/torch_tests:$repo${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -q -p no:cacheprovider -o addopts= --rootdir "$work" --timeout 300 \
    "${deselect[@]}" test_run.py launch_test.py "$@"
