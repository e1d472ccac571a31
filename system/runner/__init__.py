"""Running an experiment: the model, the start-up checks that need data, the device, and one run's
training and results (``main.py`` parses the flags and calls these)."""
