"""Assignors Tandem is compared with, and the measures of an assignment the benchmarks use."""
