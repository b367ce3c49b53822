"""Warm start: workers forked from a preloaded interpreter (the zygote) instead of exec'd fresh.

Two processes, one module each, and the records they exchange:
- `client`: the agent's side, `Preloaded`, a `process.Starter` that starts the zygote, asks it for
  workers, and spawns whatever it cannot fork.
- `server`: the zygote itself (`python -m launcher.agent.zygote`): imports torch and the preload modules,
  then forks one worker per request; the forked worker becomes the user's script.
- `messages`: the zygote's command line and the socket messages, typed, encoded in one place.

Nothing here is imported by the agent unless `--preload` is on; this package's own import is empty so
that the zygote does not load the agent's side.
"""
