"""Apps built on Tandem's public API (`faust -A examples.<name> worker`, from the repository root)."""
