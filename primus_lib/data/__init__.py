"""The data plane: sources, the DTGG planner, the task ledger, executors, shards."""
