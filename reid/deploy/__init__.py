"""Deployment: the inference network that is exported, ONNX / MINDIR export with a JSON sidecar, exported files
as evaluation engines, and using a trained model on one's own images: the feature extractor, gallery index
files and top-k search (docs/retrieval.md).

Names are imported on first use, so that the command-line tools can import their argument definitions
(reid.deploy.commands) before they select the backend."""
import importlib

_EXPORTS = {
    "InferenceNet": "inference", "swap_meta_layers": "inference",
    "ExportedModel": "export", "check_against_cfg": "export", "export_model": "export", "format_of": "export",
    "load_engine": "export", "read_sidecar": "export", "sidecar_path": "export",
    "FeatureExtractor": "extractor", "list_image_files": "extractor",
    "GalleryIndex": "gallery", "build_index": "gallery", "load_index": "gallery", "save_index": "gallery",
    "exact_search": "search", "rank_gallery": "search",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError("module 'reid.deploy' has no attribute %r" % name)
    value = getattr(importlib.import_module("reid.deploy." + module), name)
    globals()[name] = value
    return value
