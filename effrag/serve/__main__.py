"""``python -m effrag.serve --config FILE``: the same as ``effrag serve``."""
import sys

from .server import main

sys.exit(main())
