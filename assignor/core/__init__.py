"""The pure planning core: scenario in, assignment out. No I/O, no Faust."""
