"""One module per figure; each registers itself with experiments.framework.register."""
