"""``python -m emulator.cli``: the same command as ``backplane``."""
from emulator.cli import main

main()
