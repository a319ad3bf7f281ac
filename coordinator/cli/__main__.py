"""`python -m coordinator.cli`: the `tandem` command."""

import sys

from coordinator.cli.main import main

sys.exit(main())
