from reid.config.config import get_cfg, load_cfg, check_supported_values, ConfigError  # noqa: F401
