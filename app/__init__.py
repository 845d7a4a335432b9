"""The reference ad join app: `faust -A app worker`."""
