"""ACL modeling on the active backend: known answers, output contract, running-statistics modes, fast-weight
and config errors, pretrained weight surgery, full-size parameter counts."""
import numpy as np
import pytest

import compat
from compat.errors import UserError
from reid.config import get_cfg
import reid.modeling as M
from reid.modeling.backbones.resnet import RESNET50_BLOCKS
from tests.crossenv import active_backend


def small_cfg(arch="ACL", backbone="acl_resnet50_ibn_a", width=4, classes=(5, 3, 4), splits=1):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = arch
    cfg.MODEL.BACKBONE.NAME = backbone
    cfg.MODEL.BACKBONE.BASE_WIDTH = width
    cfg.MODEL.HEADS.NUM_CLASSES = list(classes)
    cfg.MODEL.NUM_SPLITS = splits
    return cfg


def t(a):
    return compat.as_tensor(np.asarray(a, np.float32))


def n(x):
    return compat.to_numpy(x).astype(np.float64)


def images(batch=4, h=64, w=32, seed=0):
    return t(np.random.RandomState(seed).rand(batch, 3, h, w) * 255)


@pytest.fixture(scope="module")
def acl():
    np.random.seed(0)
    return M.build_model(small_cfg())


# --------------------------------------------------------------------------- known answers (numpy)

def test_router_known_answer():
    np.random.seed(1)
    router = M.HyperRouter(32, 4)
    x = np.random.RandomState(2).randn(3, 32, 4, 3)
    w1, w2 = n(router.fc1.weight), n(router.fc2.weight)
    g = x.mean((2, 3))
    h = g @ w1.T
    h = np.maximum(h / np.linalg.norm(h, axis=1, keepdims=True), 0)     # L2-normalise, then ReLU
    hyper = (h @ w2.T).reshape(3, 32, 4)                                  # per-sample C x K matrix
    logits = np.einsum("nc,nck->nk", g, hyper)
    want = np.exp(logits - logits.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(n(router(t(x))), want, rtol=1e-5, atol=1e-6)


def test_small_layers_known_answers():
    rng = np.random.RandomState(3)
    x = rng.randn(4, 6, 5, 3)
    np.random.seed(4)
    gem, gate, centers, se = M.GeM(3.0), M.MetaGate(6), M.MetaCenters(6, 7, std=0.5), M.SELayer(32)
    # GeM with p=3 and clamp 1e-6
    np.testing.assert_allclose(n(gem(t(x))), (np.maximum(x, 1e-6) ** 3).mean((2, 3)) ** (1 / 3.0), rtol=1e-5)
    # gate: σ(γ)·a + (1-σ(γ))·b
    b = rng.randn(4, 6, 5, 3)
    s = 1 / (1 + np.exp(-n(gate.gate))).reshape(1, -1, 1, 1)
    np.testing.assert_allclose(n(gate(t(x), t(b))), s * x + (1 - s) * b, rtol=1e-5, atol=1e-6)
    # centers: squared Euclidean distances
    f = rng.randn(5, 6)
    c = n(centers.centers)
    np.testing.assert_allclose(n(centers(t(f))), ((f[:, None, :] - c[None]) ** 2).sum(-1), rtol=1e-4, atol=1e-5)
    # SE: x * sigmoid(fc2(relu(fc1(GAP x))))
    y = rng.randn(2, 32, 3, 3)
    z = np.maximum(y.mean((2, 3)) @ n(se.fc1.weight).T, 0) @ n(se.fc2.weight).T
    np.testing.assert_allclose(n(se(t(y))), y / (1 + np.exp(-z))[:, :, None, None], rtol=1e-5, atol=1e-6)


def test_ibn_splits_instance_and_batch_norm():
    x = np.random.RandomState(5).randn(4, 6, 5, 3) * 2 + 1
    ibn = M.MetaIBN(6)
    ibn.train()
    with M.bn_mode(ibn, "hold"):
        got = n(ibn(t(x)))
    inst = (x[:, :3] - x[:, :3].mean((2, 3), keepdims=True)) / np.sqrt(x[:, :3].var((2, 3), keepdims=True) + 1e-5)
    bat = (x[:, 3:] - x[:, 3:].mean((0, 2, 3), keepdims=True)) / np.sqrt(x[:, 3:].var((0, 2, 3), keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, np.concatenate([inst, bat], 1), rtol=1e-4, atol=1e-5)


def test_experts_equal_grouped_convs_on_repeated_input():
    """ExpertBottleneck skips the original's x.repeat(1, K, 1, 1): same numbers as its grouped formulation."""
    F = compat.F
    np.random.seed(6)
    k, c = 4, 32
    ex = M.ExpertBottleneck(c, k)
    x = t(np.random.RandomState(7).randn(3, c, 5, 4))
    with M.bn_mode(ex, "hold"):
        got = n(ex(x))
        xr = compat.torch.cat([x] * k, 1)
        out = F.relu(ex.bn1(F.conv2d(xr, ex.conv1.weight, None, 1, 0, 1, k)))
        out = F.relu(ex.bn2(ex.conv2(out)))
        want = n(F.relu(ex.bn3(ex.conv3(out)) + xr)).reshape(3, k, c, 5, 4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the IBN quirk: bn1 normalises the first half of the p channels per instance (experts 0..K/2-1)
    assert isinstance(ex.bn1, M.MetaIBN) and ex.bn1.half == (c // 4) // 2


def test_experts_are_independent():
    np.random.seed(8)
    ex = M.ExpertBottleneck(32, 4)
    ex.eval()
    x = t(np.random.RandomState(9).randn(2, 32, 4, 3))
    before = n(ex(x))
    w = n(ex.conv3.weight)
    w[8:16] += 1.0                     # expert 1 owns output channels C..2C-1 of conv3, i.e. rows 32..63 of
    w2 = n(ex.conv3.weight)            # its (K*C, p/K) weight; first change rows of expert 0 only
    w2[:32] += 1.0
    compat.assign_(ex.conv3.weight, t(w2))
    after = n(ex(x))
    changed = [not np.allclose(before[:, e], after[:, e]) for e in range(4)]
    assert changed == [True, False, False, False]


def test_init_follows_the_original():
    np.random.seed(10)
    model = M.build_model(small_cfg(width=16, classes=(200, 100, 50)))
    b = model.backbone
    w = n(b.layer3[0].conv2.weight)                       # N(0, sqrt(2 / (k*k*out)))
    assert abs(w.std() - np.sqrt(2.0 / (9 * w.shape[0]))) < 0.05 * w.std() and abs(w.mean()) < 0.01
    assert np.all(n(b.layer2[0].bn1.BN.weight) == 1) and np.all(n(b.layer2[0].bn1.BN.bias) == 0)
    assert np.all(n(b.code1.adaptor_base.bn1.weight) == 1)
    gate = n(b.code3.meta_fuse.gate)
    assert 0.07 < gate.std() < 0.13                      # randn * 0.1
    fc = n(b.code3.router.fc2.weight)                     # torch default Linear init: U(±1/sqrt(fan_in))
    assert np.abs(fc).max() <= 1 / np.sqrt(fc.shape[1]) and np.abs(fc).max() > 0.9 / np.sqrt(fc.shape[1])
    cls = n(model.heads.classifiers[0].weight)
    assert 0.009 < cls.std() < 0.011 and 0.009 < n(model.heads.center.centers).std() < 0.011


# --------------------------------------------------------------------------- contract


def seeded_backbone(cfg, **backbone_keys):
    """The backbone built from numpy seed 0, with MODEL.BACKBONE keys changed on a clone of cfg."""
    cfg = cfg.clone()
    for key, value in backbone_keys.items():
        setattr(cfg.MODEL.BACKBONE, key, value)
    np.random.seed(0)
    return M.build_model(cfg).backbone


def assert_only_scales_zeroed(backbone, default, zeroed):
    """The parameters named in `zeroed` are 0 where the default init has 1; every other parameter is drawn
    exactly as without the option."""
    defaults = dict(default.named_parameters())
    for name, p in backbone.named_parameters():
        if name in zeroed:
            assert np.all(n(p) == 0) and np.all(n(defaults[name]) == 1), name
        else:
            assert np.array_equal(n(p), n(defaults[name])), name


@pytest.mark.parametrize("arch,backbone", [("ACL", "acl_resnet50_ibn_a"), ("Baseline", "resnet50_ibn_a")])
def test_zero_init_residual_starts_every_stage_block_as_identity(arch, backbone):
    """MODEL.BACKBONE.ZERO_INIT_RESIDUAL: exactly the stage bottlenecks' bn3 scales start at 0 (the CODE blocks,
    ZERO_INIT_CODE's, and every other norm keep the original's init), so a block without projection returns
    relu(x)."""
    from reid.modeling.backbones.resnet import Bottleneck
    b = seeded_backbone(small_cfg(arch, backbone, width=8), ZERO_INIT_RESIDUAL=True)
    stage_bn3 = {"layer%d.%d.bn3.weight" % (s, i) for s in range(1, 5) for i in range(len(getattr(b, "layer%d" % s)))}
    assert len(stage_bn3) == (12 if arch == "ACL" else 16)
    assert_only_scales_zeroed(b, seeded_backbone(small_cfg(arch, backbone, width=8)), stage_bn3)
    block = b.layer2[1]
    assert isinstance(block, Bottleneck) and block.downsample is None
    x = t(np.random.RandomState(1).randn(2, block.conv1.weight.shape[1], 8, 4))
    block.train()
    np.testing.assert_allclose(n(block(x)), np.maximum(n(x), 0), atol=1e-6)

def test_zero_init_code_starts_every_code_block_as_a_normalised_copy():
    """MODEL.BACKBONE.ZERO_INIT_CODE: exactly the CODE blocks' static-branch IN scale and expert bn3 scales start
    at 0 (every other parameter drawn as without it, the numpy stream unchanged); both branches then return their
    (non-negative) input, so the block equals SE(gate(BN_inv(x), BN_spec(x))) for any router weights. The
    Baseline ignores the key."""
    b = seeded_backbone(small_cfg(width=8), ZERO_INIT_CODE=True)
    zeroed = {"code%d.%s.weight" % (i, part) for i in range(1, 5) for part in ("adaptor_base.bn3", "adaptor_sub.bn3")}
    assert len(zeroed & dict(b.named_parameters()).keys()) == 8
    assert_only_scales_zeroed(b, seeded_backbone(small_cfg(width=8)), zeroed)
    code = b.code2
    code.train()
    c = code.invariant_norm.num_features
    x = t(np.maximum(np.random.RandomState(2).randn(3, c, 8, 4), 0))   # a post-ReLU map, as in the network
    np.testing.assert_allclose(n(code.adaptor_base(x)), n(x), atol=1e-6)
    experts = n(code.adaptor_sub(x))
    assert experts.shape == (3, 4, c, 8, 4)
    np.testing.assert_allclose(experts, np.broadcast_to(n(x)[:, None], experts.shape), atol=1e-6)
    out, weights = code(x)
    expected = code.meta_se(code.meta_fuse(code.invariant_norm(x), code.specific_norm(x)))
    np.testing.assert_allclose(n(out), n(expected), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(n(weights).sum(1), 1, rtol=1e-5)
    base_cfg = small_cfg("Baseline", "resnet50_ibn_a", width=8)
    assert_only_scales_zeroed(seeded_backbone(base_cfg, ZERO_INIT_CODE=True), seeded_backbone(base_cfg), set())


def test_output_contract(acl):
    acl.train()
    out = acl(images())
    assert sorted(out) == ["center_dist", "feat_norm", "features", "logits", "neck_feat", "paths"]
    assert tuple(out["features"].shape) == tuple(out["neck_feat"].shape) == (4, 128)
    assert [tuple(l.shape) for l in out["logits"]] == [(4, 5), (4, 3), (4, 4)]
    assert tuple(out["center_dist"].shape) == (4, 12)
    np.testing.assert_allclose(np.linalg.norm(n(out["feat_norm"]), axis=1), 1, rtol=1e-5)
    paths = n(out["paths"])
    assert paths.shape == (4, 16) and (paths > 0).all()
    np.testing.assert_allclose(paths.reshape(4, 4, 4).sum(-1), 1, rtol=1e-5)   # softmax per CODE block
    acl.eval()
    feat = acl(images())
    assert tuple(feat.shape) == (4, 128)
    acl.train()
    assert acl.num_classes == [5, 3, 4] and acl.domain_offsets == [0, 5, 8]
    assert hasattr(acl, "backbone") and hasattr(acl, "heads")


def test_baseline_contract():
    np.random.seed(0)
    model = M.build_model(small_cfg("Baseline", "resnet50_ibn_a"))
    out = model(images())
    assert out["paths"] is None and out["center_dist"] is None
    assert isinstance(model.backbone, M.ResNet) and model.backbone.layer1[0].bn1.__class__ is M.MetaIBN
    assert len(model.backbone.layer3) == 6 and len(M.build_model(small_cfg()).backbone.layer3) == 5


_ELEMENTWISE = {"__mul__", "__rmul__", "__add__", "__radd__", "__sub__", "__rsub__", "__truediv__", "__rtruediv__",
                "__iadd__", "__imul__", "mul", "add", "sub", "div", "mul_", "add_", "where", "maximum", "minimum"}


def _implicit_broadcasts(run):
    """[(op, operand shape, output shape, caller in reid/)] for every elementwise op `run()` makes whose output
    is a feature map (4-D or more) and which broadcasts a non-scalar tensor operand."""
    import traceback
    torch = compat.torch
    found = []

    class Record(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") in _ELEMENTWISE and torch.is_tensor(out) and out.dim() >= 4:
                for operand in list(args) + list((kwargs or {}).values()):
                    if torch.is_tensor(operand) and 1 < operand.numel() < out.numel():
                        caller = next(("%s:%d" % (f.filename.split("/reid/")[-1], f.lineno)
                                       for f in reversed(traceback.extract_stack()) if "/reid/" in f.filename), "?")
                        found.append((func.__name__, tuple(operand.shape), tuple(out.shape), caller))
            return out

    with Record():
        run()
    return found


@pytest.mark.skipif(compat.IS_MINDSPORE, reason="records ops through torch's __torch_function__; the model code "
                    "is the same on every backend")
@pytest.mark.parametrize("splits", [1, 2], ids=["one-split", "two-splits"])
@pytest.mark.parametrize("backbone", M.BACKBONE_REGISTRY.names())
def test_no_implicit_broadcast_on_feature_maps(backbone, splits):
    """Every broadcast of a per-channel / per-sample / per-expert tensor over a feature map is written out
    (`.expand_as`): in a compiled MindSpore 2.0 CPU graph each implicitly broadcasting elementwise kernel keeps
    about four times its output in memory for the life of the graph, per graph (docs/performance.md);
    expanded first, the same op keeps nothing. torch computes both forms bit for bit alike. Two splits: the
    batch norms' per-chunk statistics (one F.batch_norm per chunk in MetaBatchNorm) too."""
    from reid.modeling.backbones.acl_resnet import SELayer
    np.random.seed(0)
    model = M.build_model(small_cfg("ACL" if backbone.startswith("acl") else "Baseline", backbone, width=8,
                                    splits=splits))

    def forwards():
        model.train()
        model(images())
        model.eval()
        model(images())
    assert _implicit_broadcasts(forwards) == []

    class ImplicitSE(SELayer):  # the check sees the form it forbids
        def forward(self, x):
            return x * compat.torch.sigmoid(self.fc2(self.fc1(x.mean((2, 3))))).reshape(2, 32, 1, 1)
    x = compat.as_tensor(np.ones((2, 32, 4, 2), np.float32))
    assert [f[1:3] for f in _implicit_broadcasts(lambda: ImplicitSE(32)(x))] == [((2, 32, 1, 1), (2, 32, 4, 2))]
    assert _implicit_broadcasts(lambda: SELayer(32)(x)) == []

def test_bn_modes_and_running_stats():
    bn = M.MetaBatchNorm(3)
    x = np.random.RandomState(11).randn(6, 3, 4, 2) * 3 + 2
    bn.train()
    with M.bn_mode(bn, "hold"):
        bn(t(x))
    np.testing.assert_array_equal(n(bn.running_mean), 0)
    bn(t(x))                                              # default 'general': torch momentum, unbiased var
    np.testing.assert_allclose(n(bn.running_mean), 0.1 * x.mean((0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(n(bn.running_var), 0.9 + 0.1 * x.var((0, 2, 3), ddof=1), rtol=1e-5)
    with M.bn_mode(bn, "eval"):
        got = n(bn(t(x)))
    want = (x - n(bn.running_mean).reshape(1, 3, 1, 1)) / np.sqrt(n(bn.running_var).reshape(1, 3, 1, 1) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert bn._bn["mode"] == "general"                   # restored on exit
    with pytest.raises(UserError, match="bn_mode"):
        with M.bn_mode(bn, "train"):
            pass


def test_frozen_bnneck_bias(acl):
    frozen = [name for name, p in acl.named_parameters() if not p.requires_grad]
    assert frozen == ["heads.bottleneck.bias"]


def test_fast_weights_errors_and_restore(acl):
    acl.eval()
    x = images(2)
    base = n(acl(x))
    w = acl.backbone.code2.router.fc2.weight
    with M.fast_weights(acl, {"backbone.code2.router.fc2.weight": w * 3.0}):
        inner = n(acl(x))
        with M.fast_weights(acl, {"backbone.code2.router.fc2.weight": w * 0.5, "heads.bottleneck.weight":
                                  acl.heads.bottleneck.weight * 2.0}):
            nested = n(acl(x))
        np.testing.assert_allclose(n(acl(x)), inner, rtol=1e-6)
    np.testing.assert_allclose(n(acl(x)), base, rtol=1e-6)
    assert not np.allclose(inner, base) and not np.allclose(nested, inner)
    with pytest.raises(UserError, match="not a parameter"):
        with M.fast_weights(acl, {"backbone.code2.router.fc9.weight": w}):
            pass
    with pytest.raises(UserError, match="shape"):
        with M.fast_weights(acl, {"backbone.code2.router.fc2.weight": w[:1]}):
            pass
    acl.train()


def test_num_splits(acl):
    assert acl.num_splits == 1
    acl.num_splits = 2
    assert all(m._bn["num_splits"] == 2 for m in acl.modules() if isinstance(m, M.MetaBatchNorm))
    with pytest.raises(UserError, match="NUM_SPLITS"):
        acl(images(3))
    acl.num_splits = 1
    with pytest.raises(UserError, match="NUM_SPLITS"):
        acl.num_splits = 0


@pytest.mark.parametrize("change,match", [
    (("MODEL.META_ARCHITECTURE", "MGN"), "meta-architecture"),
    (("MODEL.BACKBONE.NAME", "resnet50"), "META_ARCHITECTURE ACL needs"),
    (("MODEL.BACKBONE.NAME", "resnet101"), "unknown backbone"),
    (("MODEL.BACKBONE.BASE_WIDTH", 6), "BASE_WIDTH"),
    (("MODEL.BACKBONE.NUM_EXPERTS", 0), "NUM_EXPERTS"),
    (("MODEL.BACKBONE.LAST_STRIDE", 3), "LAST_STRIDE"),
    (("MODEL.HEADS.NUM_CLASSES", []), "NUM_CLASSES"),
    (("MODEL.HEADS.POOL_LAYER", "max"), "POOL_LAYER"),
    (("MODEL.PIXEL_STD", [1.0, 0.0, 1.0]), "PIXEL_STD"),
])
def test_config_errors(change, match):
    cfg = small_cfg()
    key, value = change
    node = cfg
    for part in key.split(".")[:-1]:
        node = getattr(node, part)
    setattr(node, key.split(".")[-1], value)
    with pytest.raises(UserError, match=match):
        M.build_model(cfg)


def test_baseline_rejects_acl_backbone_and_bad_images(acl):
    with pytest.raises(UserError, match="Baseline needs"):
        M.build_model(small_cfg("Baseline", "acl_resnet50_ibn_a"))
    with pytest.raises(UserError, match="unknown backbone"):
        M.build_model(small_cfg("Baseline", "vit"))
    with pytest.raises(UserError, match=r"\(N, 3, H, W\)"):
        acl(t(np.zeros((2, 1, 64, 32))))
    assert M.BACKBONE_REGISTRY.names() == ["acl_resnet50_ibn_a", "resnet50", "resnet50_ibn_a"]
    assert M.META_ARCH_REGISTRY.names() == ["ACL", "Baseline"]


def test_state_dict_round_trip_through_compat_checkpoint(acl, tmp_path):
    from compat import checkpoint
    state = checkpoint.state_dict(acl)
    assert sorted(state) == sorted(M.numpy_state(acl))
    path = str(tmp_path / "acl.pth")
    checkpoint.save(state, path)
    np.random.seed(123)
    other = M.build_model(small_cfg())
    checkpoint.load_state_dict(other, checkpoint.load(path))
    acl.eval(), other.eval()
    x = images(2)
    np.testing.assert_allclose(n(other(x)), n(acl(x)), rtol=1e-6, atol=1e-6)
    acl.train()


# --------------------------------------------------------------------------- pretrained weights

def ibn_a_checkpoint(width, seed=0):
    """A state dict with the key layout and shapes of IBN-Net's resnet50_ibn_a-d9d0bb7b.pth at `width`."""
    rng = np.random.RandomState(seed)
    ck = {}

    def bn(prefix, c, running=True):
        ck[prefix + ".weight"], ck[prefix + ".bias"] = rng.rand(c) + 0.5, rng.randn(c)
        if running:
            ck[prefix + ".running_mean"], ck[prefix + ".running_var"] = rng.randn(c), rng.rand(c) + 0.5
            ck[prefix + ".num_batches_tracked"] = np.array(1000, np.int64)

    ck["conv1.weight"] = rng.randn(width, 3, 7, 7)
    bn("bn1", width)
    inplanes = width
    for s, blocks in enumerate(RESNET50_BLOCKS, 1):
        planes = width * 2 ** (s - 1)
        for b in range(blocks):
            p = "layer%d.%d" % (s, b)
            cin = inplanes if b == 0 else planes * 4
            ck[p + ".conv1.weight"] = rng.randn(planes, cin, 1, 1)
            if s < 4:
                bn(p + ".bn1.IN", planes // 2, running=False)
                bn(p + ".bn1.BN", planes - planes // 2)
            else:
                bn(p + ".bn1", planes)
            ck[p + ".conv2.weight"] = rng.randn(planes, planes, 3, 3)
            bn(p + ".bn2", planes)
            ck[p + ".conv3.weight"] = rng.randn(planes * 4, planes, 1, 1)
            bn(p + ".bn3", planes * 4)
            if b == 0:
                ck[p + ".downsample.0.weight"] = rng.randn(planes * 4, cin, 1, 1)
                bn(p + ".downsample.1", planes * 4)
        inplanes = planes * 4
    ck["fc.weight"], ck["fc.bias"] = rng.randn(1000, inplanes), rng.randn(1000)
    return {k: np.asarray(v, np.float32) if v.dtype != np.int64 else v for k, v in ck.items()}


def pool_by_loop(w, k):
    """Average consecutive groups of k input channels, written as a loop (independent of the library)."""
    out = np.zeros((w.shape[0], w.shape[1] // k) + w.shape[2:], np.float64)
    for j in range(w.shape[1] // k):
        for i in range(k):
            out[:, j] += w[:, j * k + i] / k
    return out


def test_acl_surgery_rules():
    np.random.seed(12)
    model = M.build_model(small_cfg())
    before = M.numpy_state(model)
    ck = ibn_a_checkpoint(4)
    M.load_pretrained_backbone(model, ck)
    after = {k[len("backbone."):]: v for k, v in M.numpy_state(model).items() if k.startswith("backbone.")}
    k = 4
    checked = set()

    def eq(name, value):
        np.testing.assert_allclose(after[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
        checked.add(name)

    for name in after:                                    # stem and main stages: by name
        if not name.startswith("code"):
            eq(name, ck[name])
    for s, blocks in enumerate(RESNET50_BLOCKS, 1):
        src, dst = "layer%d.%d" % (s, blocks - 1), "code%d." % s
        for layer in ("conv1", "conv2", "conv3"):         # static branch: the stage's last block
            eq(dst + "adaptor_base.%s.weight" % layer, ck[src + ".%s.weight" % layer])
        for bn in ("bn2", "bn3") + (("bn1",) if s == 4 else ()):
            for field in ("weight", "bias"):
                eq(dst + "adaptor_base.%s.%s" % (bn, field), ck["%s.%s.%s" % (src, bn, field)])
        if s < 4:                                         # IBN block has no plain bn1.weight: keeps its init
            eq(dst + "adaptor_base.bn1.weight", np.ones_like(after[dst + "adaptor_base.bn1.weight"]))
            eq(dst + "adaptor_base.bn1.bias", np.zeros_like(after[dst + "adaptor_base.bn1.bias"]))
        sub = dst + "adaptor_sub."
        eq(sub + "conv1.weight", ck[src + ".conv1.weight"])
        eq(sub + "conv2.weight", pool_by_loop(ck[src + ".conv2.weight"], k))
        eq(sub + "conv3.weight", np.concatenate([pool_by_loop(ck[src + ".conv3.weight"], k)] * k, 0))
        for field in ("weight", "bias", "running_mean", "running_var"):
            eq(sub + "bn3." + field, np.concatenate([ck["%s.bn3.%s" % (src, field)]] * k))
            eq(sub + "bn2." + field, ck["%s.bn2.%s" % (src, field)])
            if s < 4:
                eq(sub + "bn1.BN." + field, ck["%s.bn1.BN.%s" % (src, field)])
            else:                                         # plain BN block -> IBN experts: split in halves
                half = ck["%s.bn1.%s" % (src, field)].shape[0] // 2
                eq(sub + "bn1.BN." + field, ck["%s.bn1.%s" % (src, field)][half:])
                if field in ("weight", "bias"):
                    eq(sub + "bn1.IN." + field, ck["%s.bn1.%s" % (src, field)][:half])
            if s < 4 and field in ("weight", "bias"):
                eq(sub + "bn1.IN." + field, ck["%s.bn1.IN.%s" % (src, field)])
    untouched = [name for name in after if name not in checked]
    assert untouched and all(name.split(".")[1] in ("router", "invariant_norm", "specific_norm", "meta_fuse",
                                                    "meta_se") for name in untouched)
    for name in untouched:                                # router, fusion norms, gate, SE keep their init
        np.testing.assert_array_equal(after[name], before["backbone." + name])
    heads = [name for name in before if name.startswith("heads.")]
    assert all(np.array_equal(M.numpy_state(model)[h], before[h]) for h in heads)


def test_pretrained_from_file_and_errors(tmp_path):
    from compat import checkpoint
    ck = ibn_a_checkpoint(4, seed=1)
    path = str(tmp_path / "resnet50_ibn_a-d9d0bb7b.pth")
    checkpoint.save(ck, path)
    np.random.seed(13)
    a = M.build_model(small_cfg())
    np.random.seed(13)
    b = M.build_model(small_cfg())
    M.load_pretrained_backbone(a, path)
    M.load_pretrained_backbone(b, ck)
    sa, sb = M.numpy_state(a.backbone), M.numpy_state(b.backbone)
    assert all(np.array_equal(sa[name], sb[name]) for name in sa)
    # through the config
    cfg = small_cfg()
    cfg.MODEL.BACKBONE.PRETRAIN, cfg.MODEL.BACKBONE.PRETRAIN_PATH = True, path
    np.testing.assert_array_equal(M.numpy_state(M.build_model(cfg))["backbone.layer2.1.conv2.weight"],
                                  ck["layer2.1.conv2.weight"])
    with pytest.raises(UserError, match="do not exist"):
        M.load_pretrained_backbone(a, str(tmp_path / "missing.pth"))
    with pytest.raises(UserError, match="conv1.weight has shape"):      # a checkpoint of another width
        M.load_pretrained_backbone(a, ibn_a_checkpoint(8))
    broken = dict(ck)
    del broken["layer3.2.bn1.BN.running_var"]
    with pytest.raises(UserError, match="layer3.2.bn1.BN.running_var"):
        M.load_pretrained_backbone(a, broken)


def test_plain_resnet_loads_by_name():
    np.random.seed(14)
    model = M.build_model(small_cfg("Baseline", "resnet50_ibn_a"))
    ck = ibn_a_checkpoint(4, seed=2)
    loaded = M.load_pretrained_backbone(model, ck)
    state = M.numpy_state(model.backbone)
    assert sorted(loaded) == sorted(state)
    assert all(np.array_equal(state[name], ck[name]) for name in state)
    plain = M.build_model(small_cfg("Baseline", "resnet50"))
    with pytest.raises(UserError, match="layer1.0.bn1.weight"):         # IBN checkpoint, plain model
        M.load_pretrained_backbone(plain, ck)


# --------------------------------------------------------------------------- size

def test_full_size_parameter_counts():
    """docs/method.md#size: backbone 29.62 M (we leave out the dead fc_classifier 46,080 and map1..4 7,680),
    train time ~85.8 M with the Protocol-2 ->CUHK03 classes. Counted once, on torch (fast construction)."""
    if active_backend() != "torch":
        pytest.skip("counted on the torch backend (make test runs it there)")
    np.random.seed(0)
    model = M.build_model(get_cfg())
    backbone = M.count_parameters(model.backbone)
    assert backbone == 29567552
    assert abs(backbone - 29.62e6) / 29.62e6 < 0.005
    assert backbone + 46080 + 7680 == 29621312          # the spec's count, dead parts included
    total = M.count_parameters(model)
    assert total == backbone + 2 * 2048 + 2 * 2048 * (11934 + 751 + 1041)
    assert abs(total - 85.8e6) / 85.8e6 < 0.005
    assert M.count_parameters(model, trainable_only=True) == total - 2048
    assert model.heads.feat_dim == 2048 and model.num_classes == [11934, 751, 1041]


# --------------------------------------------------------------------------- depth

@pytest.mark.parametrize("depth, blocks", [("26x", (2, 2, 2, 2)), ("50x", (3, 4, 6, 3)), ("101x", (3, 4, 23, 3))])
def test_depth_sets_blocks_per_stage(depth, blocks):
    """MODEL.BACKBONE.DEPTH: the plain backbones have those bottlenecks per stage; ACL one fewer in each main
    stage, its CODE block standing for the last; the head sees the same feature width at every depth."""
    for arch, backbone in (("Baseline", "resnet50_ibn_a"), ("ACL", "acl_resnet50_ibn_a")):
        cfg = small_cfg(arch, backbone)
        cfg.MODEL.BACKBONE.DEPTH = depth
        net = M.build_model(cfg).backbone
        main = [len(getattr(net, "layer%d" % s)) for s in range(1, 5)]
        assert main == [n - (arch == "ACL") for n in blocks], (arch, depth)
        assert net.feat_dim == 4 * 8 * 4
        if arch == "ACL":
            assert all(hasattr(net, "code%d" % s) for s in range(1, 5))


def test_depth_errors():
    cfg = small_cfg()
    cfg.MODEL.BACKBONE.DEPTH = "34x"
    with pytest.raises(UserError, match=r"DEPTH must be one of 26x, 50x, 101x, got '34x'"):
        M.build_model(cfg)
    cfg = small_cfg()
    cfg.MODEL.BACKBONE.DEPTH, cfg.MODEL.BACKBONE.PRETRAIN = "26x", True
    with pytest.raises(UserError, match="loads ResNet-50 weights but MODEL.BACKBONE.DEPTH is '26x'"):
        M.build_model(cfg)


@pytest.mark.parametrize("compiled", [False, True], ids=["op-by-op", "compiled"])
def test_feature_map_forms_give_the_plain_values_and_gradients(compiled):
    """spatial_mean, scale_channels (reid/modeling/layers.py) and the experts' residual broadcast as
    `torch.bmm(torch.ones(n, k, 1).type_as(x), x)` (reid/modeling/backbones/acl_resnet.py), the forms the CODE blocks
    and poolings write their means and broadcasts in, against numpy's mean over (2, 3), the broadcast product and
    the broadcast sum: values, and the gradients of a weighted sum with respect to every input (the sums over
    the broadcast axes), op by op and compiled (MindSpore only)."""
    from reid.modeling.layers import scale_channels, spatial_mean
    if compiled and not compat.IS_MINDSPORE:
        pytest.skip("compiled execution exists on MindSpore only")
    rng = np.random.RandomState(5)
    x, s = rng.randn(3, 4, 5, 2), rng.randn(3, 4)
    rows, k = rng.randn(3, 1, 6), 4
    w_mean, w_scale, w_rows = rng.randn(3, 4), rng.randn(3, 4, 5, 2), rng.randn(3, k, 6)
    holder = compat.nn.Module()
    params = [compat.nn.Parameter(t(a)) for a in (x, s, rows)]
    for i, p in enumerate(params):
        setattr(holder, "p%d_%s" % (i, compiled), p)
    weights = [t(a) for a in (w_mean, w_scale, w_rows)]

    def outputs(xp, sp, rp):
        ones = compat.torch.ones(int(rp.shape[0]), k, 1).type_as(rp)
        return spatial_mean(xp), scale_channels(xp, sp), compat.torch.bmm(ones, rp)

    def loss_fn():
        mean, scaled, broad = outputs(*params)
        return (mean * weights[0]).sum() + (scaled * weights[1]).sum() + (broad * weights[2]).sum()
    if compiled:
        def loss_and_aux():
            loss = loss_fn()
            return loss, {"loss": loss}
        compat.jit.prepare(holder)
        got = [n(o) for o in compat.jit.compiled(outputs, "test_map_forms")(*params)]
        _, _, grads = compat.jit.value_and_grad(loss_and_aux, params, "test_map_forms_grad")()
    else:
        got = [n(o) for o in outputs(*params)]
        _, _, grads = compat.value_and_grad(loss_fn, params)()
    np.testing.assert_allclose(got[0], x.mean((2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], x * s[:, :, None, None], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2], np.broadcast_to(rows, (3, k, 6)).astype(np.float32))
    want = (w_mean[:, :, None, None] / 10.0 + w_scale * s[:, :, None, None],   # d/dx: mean's and product's
            (w_scale * x).sum((2, 3)),                                          # d/ds: over H, W
            w_rows.sum(1, keepdims=True))                                       # d/drows: over the k rows
    for name, g, w in zip(("x", "s", "rows"), grads, want):
        np.testing.assert_allclose(n(g), w, rtol=1e-5, atol=1e-5, err_msg=name)


def test_scale_rows_compiled_is_the_expanded_product_to_the_last_bit():
    """compat.scale_rows compiled on MindSpore (Tile, its backward written out) against the product it stands
    for, x times s expanded, compiled through autodiff: the same values and gradients bit for bit, on a map big
    enough for MindSpore's kernels to split their work over threads. (Op by op and on torch it is that
    product.)"""
    if not compat.IS_MINDSPORE:
        pytest.skip("compiled execution exists on MindSpore only")
    rng = np.random.RandomState(6)
    x, s, w = rng.randn(96, 700), rng.randn(96, 1), rng.randn(96, 700)
    holder = compat.nn.Module()
    params = [compat.nn.Parameter(t(a)) for a in (x, s)]
    for i, p in enumerate(params):
        setattr(holder, "p%d_scale_rows" % i, p)
    weight = t(w)

    def expanded(xp, sp):
        return xp * sp.expand_as(xp)
    forms = {"scale_rows": compat.scale_rows, "expanded": expanded}

    def loss_of(form):
        def loss_and_aux():
            loss = (form(*params) * weight).sum()
            return loss, {"loss": loss}
        return loss_and_aux
    compat.jit.prepare(holder)
    got = {}
    for name, form in forms.items():
        value = compat.jit.compiled(form, "test_scale_rows_%s" % name)(*params)
        _, _, grads = compat.jit.value_and_grad(loss_of(form), params, "test_scale_rows_grad_%s" % name)()
        got[name] = [n(value)] + [n(g) for g in grads]
    np.testing.assert_allclose(got["expanded"][0], x * s, rtol=1e-6)
    for what, a, b in zip(("value", "d/dx", "d/ds"), got["scale_rows"], got["expanded"]):
        np.testing.assert_array_equal(a, b, err_msg=what)
