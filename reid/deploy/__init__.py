"""Deployment: the inference network that is exported, ONNX / MINDIR export with a JSON sidecar, and exported
files as evaluation engines."""
from reid.deploy.inference import InferenceNet, swap_meta_layers  # noqa: F401
from reid.deploy.export import (ExportedModel, check_against_cfg, export_model, format_of, load_engine,  # noqa: F401
                                read_sidecar, sidecar_path)

ENGINES = ("eager", "onnx", "mindir")
