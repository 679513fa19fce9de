"""The crash-loop child: count the launch in a file, exit 1 at once.

    crashchild.py COUNTFILE
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"x\n")
    sys.exit(1)
