"""The training loop (``primus train``) and what feeds it."""
