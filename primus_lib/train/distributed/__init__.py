"""Trainers of several ranks: the process group, the data-parallel coordinator, DMP-sharded tables."""
