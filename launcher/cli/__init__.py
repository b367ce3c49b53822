"""The command line, run in the user's shell: flags and subcommands, and the composition root.

- `start`: the entry (`python -m launcher`, the `launcher` script): a plain launch line is read by
  `flags` (the launch options as data) without click, and runs; any other goes to `commands`.
- `commands`: click turns flags into one frozen `LaunchConfig`; the subcommands (`status`, `report`,
  `check`, `bench`) and `python -m launcher.launch` start here. `deps`: the interpreter has what the
  launcher needs, checked before anything is imported.
- `run`: the composition root: wires the config, the rendezvous, the agent, the policy and the
  telemetry, owns the console and the one `logging` handler, and returns the exit code.
- `view`: the live view on a terminal; `status`: `launcher status`, read-only from a job's store;
  `report`: `launcher report`, one HTML page from the nodes' events files.

Only this package writes to the console. It may import every other part of the launcher; nothing
imports it (the root's `__main__` and `launch` are its entry points).
"""
