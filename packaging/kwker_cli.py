"""The frozen app's entry point for the `kwker` command line (see kwker.spec)."""

import sys

from kwker.cli import main

sys.exit(main())
