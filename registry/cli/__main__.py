"""``python -m registry.cli`` runs the mlreg command."""

from registry.cli.main import main

main()
