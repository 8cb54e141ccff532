import sys

from kwker.cli import main

sys.exit(main())
