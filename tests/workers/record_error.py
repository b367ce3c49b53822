"""A main decorated with `launcher.record` that raises: the error file carries message and traceback."""

from launcher import record


@record
def main():
    raise ValueError("bad learning rate -1")


if __name__ == "__main__":
    main()
