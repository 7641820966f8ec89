"""Sensors of the Primus Airflow plugin (the scaler)."""
