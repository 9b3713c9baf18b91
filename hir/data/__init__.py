"""Prepare stage: dataset adapters and the graph snapshot they build."""
