"""The operators' layer: the admin API and the status page."""
