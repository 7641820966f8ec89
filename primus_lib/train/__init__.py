"""The trainer: MTRM towers over shared TorchRec embeddings (Algorithm 1), the training
modes, the priority reader, checkpointed data positions, and the backtest."""
