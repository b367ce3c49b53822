"""Print $LINES lines of $WIDTH characters as fast as possible, each "<rank>:<i>:" + one letter per rank."""

import os

rank = int(os.environ["RANK"])
width = int(os.environ.get("WIDTH", "5000"))
letter = "abcdefgh"[rank]
for i in range(int(os.environ.get("LINES", "200"))):
    print(f"{rank}:{i}:" + letter * width)
