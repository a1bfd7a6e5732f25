"""Experiments: reproduce the HetRL paper's figures (see run.py and figures/)."""
