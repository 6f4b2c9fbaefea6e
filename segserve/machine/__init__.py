"""The machine a measurement ran on: what it is (identity) and who else used it meanwhile (disturbance)."""
