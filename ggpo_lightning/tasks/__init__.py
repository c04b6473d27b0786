"""Synthetic math tasks: procedurally generated problems with gold answers."""
