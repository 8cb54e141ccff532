"""The frozen app's entry point for `kwker-chat` (see kwker.spec)."""

import sys

from kwker.app import main

sys.exit(main())
