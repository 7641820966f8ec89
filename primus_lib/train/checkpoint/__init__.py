"""Checkpoints: model + optimizers + data position, written atomically, read without unpickling."""
