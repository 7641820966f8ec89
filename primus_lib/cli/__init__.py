"""The ``primus`` command. Each subcommand lives in its own module with ``register(subparsers)``
and keeps heavy imports (torch, pyarrow, kafka) inside its handler so ``--help`` stays fast."""
