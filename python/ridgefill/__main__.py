"""`python -m ridgefill ...` = the `ridgefill` command."""
from .cli import main

main()
