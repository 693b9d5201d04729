"""`python -m flotilla.engine.server`."""

import sys

from flotilla.engine.server import main

sys.exit(main())
