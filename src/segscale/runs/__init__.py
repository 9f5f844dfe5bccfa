"""What training and inference share: the run folder, and the objects built from a config."""
