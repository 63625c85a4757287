"""Triarch's Pulumi program; everything happens in triarch.program."""

from triarch.program import main

main()
