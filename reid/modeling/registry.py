"""The model registries (the Registry class is shared with the datasets: reid/registry.py)."""
from reid.registry import Registry

META_ARCH_REGISTRY = Registry("meta-architecture", "MODEL.META_ARCHITECTURE")
BACKBONE_REGISTRY = Registry("backbone", "MODEL.BACKBONE.NAME")
HEAD_REGISTRY = Registry("head", "MODEL.HEADS.NAME")
