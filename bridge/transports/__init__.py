"""HTTP shells over the gateway: they move bytes and map faults to statuses."""
