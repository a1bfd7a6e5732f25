"""Engines that hold a model and run one RL role on one device (no Ray here)."""
