"""`python -m ttftscope`, the same as the `ttftscope` console script."""
import sys

from ttftscope.cli import main

sys.exit(main())
