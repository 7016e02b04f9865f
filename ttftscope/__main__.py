"""`python -m ttftscope`, the same as the `ttftscope` console script."""
import sys

from ttftscope.cli import main

if __name__ == "__main__":
    sys.exit(main())
