from reid.config.config import get_cfg, load_cfg, ConfigError  # noqa: F401
