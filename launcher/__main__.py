import sys

try:
    from launcher.cli.commands import main
except ModuleNotFoundError as e:  # run with an interpreter that lacks click: one line, as for the others
    if (e.name or "launcher").partition(".")[0] == "launcher":
        raise
    from launcher.cli.deps import before_cli

    sys.stderr.write(f"launcher: error: {before_cli(e.name)}\n")
    sys.exit(2)

if __name__ == "__main__":
    main()
