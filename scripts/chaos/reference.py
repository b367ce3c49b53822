"""The in-place shape's reference: the final weights of the same job run undisturbed, per rank, computed
once per configuration (world size, steps, training seed) and cached in the campaign's folder."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .proc import IN_PLACE_STEPS, ROOT
from .records import StepLine

RUN_LIMIT = 300.0  # s the undisturbed run may take (its steps do not sleep)


@dataclass(frozen=True)
class Reference:
    """The undisturbed run's final weights, rank by rank (sha256 of each rank's model state_dict)."""

    world: int
    steps: int
    seed: int
    digests: tuple[str, ...]
    path: Path  # its cache file
    cached: bool = False  # read from the cache, not run now

    def describe(self) -> str:
        """One line for the campaign's output."""
        how = "cached" if self.cached else "an undisturbed run just now, cached"
        return (
            f"reference weights for world {self.world}, {self.steps} steps, seed {self.seed}: "
            f"rank 0 {self.digests[0][:12]}... ({how} in {self.path})"
        )


def key() -> str:
    """What the weights depend on besides the configuration: the worker, the job's in-place code, torch."""
    h = hashlib.sha256(IN_PLACE_STEPS.read_bytes())
    for f in sorted((ROOT / "launcher" / "worker" / "inplace").glob("*.py")):
        h.update(f.read_bytes())
    h.update(metadata.version("torch").encode())
    return h.hexdigest()[:16]


def reference(folder: Path, world: int, steps: int, seed: int) -> Reference:
    """The reference for this configuration: from `folder`'s cache, else run undisturbed and cached there."""
    path = folder / f"reference-w{world}-n{steps}-s{seed}-{key()}.json"
    if path.exists():
        d = json.loads(path.read_text())
        return Reference(world, steps, seed, tuple(d["digests"]), path, cached=True)
    digests = run(world, steps, seed)
    folder.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(f".{os.getpid()}.part")
    part.write_text(json.dumps({"world": world, "steps": steps, "seed": seed, "digests": list(digests)}))
    part.replace(path)
    return Reference(world, steps, seed, digests, path)


def run(world: int, steps: int, seed: int) -> tuple[str, ...]:
    """Each rank's final weights digest after the job ran undisturbed (one node, `world` workers, no sleep)."""
    with tempfile.TemporaryDirectory(prefix="chaos-reference-") as log:
        env = dict(os.environ, PYTHONPATH=str(ROOT), STEPS=str(steps), STEP_TIME="0", SEED=str(seed), STEP_LOG=log)
        env.pop("PET_PRELOAD", None)
        argv = [sys.executable, "-m", "launcher", "--standalone", "--nproc_per_node", str(world)]
        argv += ["--recovery", "in-place", "--preload", "--max_restarts", "0", str(IN_PLACE_STEPS)]
        p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        try:
            out, _ = p.communicate(timeout=RUN_LIMIT)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise RuntimeError(f"the undisturbed reference run took over {RUN_LIMIT:g} s") from None
        lines = [x for f in sorted(Path(log).iterdir()) for x in map(StepLine.parse, f.read_text().splitlines())]
        finals = {x.rank: x for x in lines if x is not None and x.kind == "final"}
    if p.returncode != 0 or sorted(finals) != list(range(world)):
        raise RuntimeError(f"the undisturbed reference run failed (exit {p.returncode}): {out[-2000:]}")
    bad = [x for x in finals.values() if x.step != steps or x.lineage != steps or x.applied != steps]
    if bad:
        raise RuntimeError(f"the undisturbed reference run did not apply each of its {steps} steps once: {bad}")
    return tuple(finals[r].digest for r in range(world))
