"""Builders from config: `build_model(cfg)`; registries of backbones, heads and meta-architectures."""
from reid.modeling.backbones.acl_resnet import ACLResNet
from reid.modeling.backbones.resnet import ResNet, stage_blocks, stage_channels
from reid.modeling.heads import MetaEmbeddingHead
from reid.modeling.meta_arch import ReIDModel
from reid.modeling.registry import BACKBONE_REGISTRY, HEAD_REGISTRY, META_ARCH_REGISTRY
from reid.errors import UserError


@BACKBONE_REGISTRY.register("acl_resnet50_ibn_a")
def build_acl_resnet50_ibn_a(cfg):
    b = cfg.MODEL.BACKBONE
    main = tuple(n - 1 for n in stage_blocks(b.DEPTH))   # each stage's last block is its CODE block
    return ACLResNet(b.BASE_WIDTH, b.LAST_STRIDE, b.WITH_IBN, b.NUM_EXPERTS, blocks=main,
                     zero_init_residual=b.ZERO_INIT_RESIDUAL, zero_init_code=b.ZERO_INIT_CODE)


@BACKBONE_REGISTRY.register("resnet50")
def build_resnet50(cfg):
    b = cfg.MODEL.BACKBONE
    return ResNet(b.BASE_WIDTH, b.LAST_STRIDE, with_ibn=False, blocks=stage_blocks(b.DEPTH),
                  zero_init_residual=b.ZERO_INIT_RESIDUAL)


@BACKBONE_REGISTRY.register("resnet50_ibn_a")
def build_resnet50_ibn_a(cfg):
    b = cfg.MODEL.BACKBONE
    return ResNet(b.BASE_WIDTH, b.LAST_STRIDE, with_ibn=True, blocks=stage_blocks(b.DEPTH),
                  zero_init_residual=b.ZERO_INIT_RESIDUAL)


@HEAD_REGISTRY.register("MetaEmbeddingHead")
def build_meta_embedding_head(cfg, feat_dim, with_centers=True):
    h = cfg.MODEL.HEADS
    return MetaEmbeddingHead(feat_dim, list(h.NUM_CLASSES), h.POOL_LAYER, h.GEM_P, h.SCALE, with_centers)


def build_backbone(cfg):
    return BACKBONE_REGISTRY.get(cfg.MODEL.BACKBONE.NAME)(cfg)


# MODEL keys that no compiled graph bakes in: weights are graph inputs (Parameters), the rest is runtime
GRAPH_NEUTRAL_KEYS = ("WEIGHTS", "DEVICE", "JIT", "NUM_THREADS", "COMPILE_CACHE")


def graph_key(cfg):
    """The model config as text, less the keys no compiled graph depends on: with the source code and the
    input shapes it names a graph in the compile cache (compat/jit.py), so a changed setting builds anew."""
    model = cfg.MODEL.clone()
    model.defrost()
    for key in GRAPH_NEUTRAL_KEYS:
        model.pop(key, None)
    model.BACKBONE.pop("PRETRAIN_PATH", None)
    return model.dump()


def _assemble(cfg, backbone, with_centers):
    heads = HEAD_REGISTRY.get(cfg.MODEL.HEADS.NAME)(cfg, backbone.feat_dim, with_centers)
    model = ReIDModel(backbone, heads, cfg.MODEL.PIXEL_MEAN, cfg.MODEL.PIXEL_STD, cfg.MODEL.NUM_SPLITS,
                      jit_eval=cfg.TEST.JIT, graph_key=graph_key(cfg))
    if cfg.MODEL.BACKBONE.PRETRAIN:
        if cfg.MODEL.BACKBONE.DEPTH != "50x":
            raise UserError("MODEL.BACKBONE.PRETRAIN loads ResNet-50 weights but MODEL.BACKBONE.DEPTH is %r; set DEPTH "
                            "50x or PRETRAIN False" % cfg.MODEL.BACKBONE.DEPTH)
        from reid.modeling.pretrained import load_pretrained_backbone
        load_pretrained_backbone(model, cfg.MODEL.BACKBONE.PRETRAIN_PATH)
    return model


@META_ARCH_REGISTRY.register("ACL")
def build_acl(cfg):
    """ACL: CODE-block backbone (router weights as `paths`), head with per-domain classifiers and centers."""
    BACKBONE_REGISTRY.get(cfg.MODEL.BACKBONE.NAME)   # unknown names first get the list of known ones
    if cfg.MODEL.BACKBONE.NAME != "acl_resnet50_ibn_a":
        raise UserError("META_ARCHITECTURE ACL needs MODEL.BACKBONE.NAME acl_resnet50_ibn_a (got %r); use "
                        "MODEL.META_ARCHITECTURE Baseline for a plain ResNet" % cfg.MODEL.BACKBONE.NAME)
    return _assemble(cfg, build_backbone(cfg), with_centers=True)


@META_ARCH_REGISTRY.register("Baseline")
def build_baseline(cfg):
    """Bag of tricks: plain ResNet-50 (-IBN-a), BNNeck, per-domain classifiers; no centers, `paths` is None."""
    BACKBONE_REGISTRY.get(cfg.MODEL.BACKBONE.NAME)
    if cfg.MODEL.BACKBONE.NAME not in ("resnet50", "resnet50_ibn_a"):
        raise UserError("META_ARCHITECTURE Baseline needs MODEL.BACKBONE.NAME resnet50 or resnet50_ibn_a (got %r)"
                        % cfg.MODEL.BACKBONE.NAME)
    return _assemble(cfg, build_backbone(cfg), with_centers=False)


def feature_size(cfg):
    """The size of the eval feature cfg's network gives (its backbone's last stage; both backbones), known
    without building it."""
    return stage_channels(int(cfg.MODEL.BACKBONE.BASE_WIDTH), 3)


def build_model(cfg):
    """The network described by cfg.MODEL (`build_model(get_cfg())` is the full-size ACL network).
    Weights are drawn from numpy's global RNG: seed it for reproducible (and backend-identical) init."""
    return META_ARCH_REGISTRY.get(cfg.MODEL.META_ARCHITECTURE)(cfg)
