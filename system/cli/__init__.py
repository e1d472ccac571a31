"""The command line's machinery: flags that switch both ways, declared ranges, typed hyperparameters and
the catalogue of PFLlib's general and the platform's flags (`flags`); `--config FILE.toml` (`config_file`)."""
