"""The frozen app's one entry point (see kwker.spec): `kwker` runs the command line, any other name
(`kwker-chat`) the chat window. One executable serves both, through a link named `kwker`: each
PyInstaller executable carries its own copy of the Python modules (33 MB)."""

import os
import sys

name = os.path.basename(sys.argv[0]).lower().removesuffix(".exe")
if name == "kwker":
    from kwker.cli import main
else:
    from kwker.app import main

sys.exit(main())
