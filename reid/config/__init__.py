from reid.config.config import (get_cfg, load_cfg, check_supported_values, augmentation_off_opts,  # noqa: F401
                                ConfigError, add_custom_dataset, check_custom_datasets)
