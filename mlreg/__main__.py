"""``python -m mlreg`` runs the mlreg command."""

from mlreg.cli.main import main

main()
